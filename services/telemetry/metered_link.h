// A Link that counts the tensor bytes passing through another link and times
// each Send (which blocks under back-pressure, so its duration is the
// transport's share of a stage's busy time) into a stage's metrics.
#ifndef GPIPE_SERVICES_TELEMETRY_METERED_LINK_H_
#define GPIPE_SERVICES_TELEMETRY_METERED_LINK_H_

#include <memory>

#include "services/telemetry/stage_metrics.h"
#include "services/transport/link.h"

namespace gpipe {

class MeteredLink : public Link {
 public:
  // Neither is owned; both must outlive this link.
  MeteredLink(Link* inner, StageMetrics* metrics)
      : inner_(inner), metrics_(metrics) {}

  absl::Status Send(Message message) override;
  absl::StatusOr<Message> Receive() override;
  void Close() override { inner_->Close(); }
  int64_t bytes_sent() const override { return inner_->bytes_sent(); }
  int64_t bytes_received() const override { return inner_->bytes_received(); }
  bool CarriesDeviceTensors() override {
    return inner_->CarriesDeviceTensors();
  }

 private:
  Link* inner_;
  StageMetrics* metrics_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_METERED_LINK_H_
