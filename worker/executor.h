// Runs the worker's stage assignment: builds the stage's layers, connects
// its links (the downstream one as a gRPC client, the upstream one handed
// over by the Exchange handler), runs the steps, the final evaluation, and
// writes the stage's final parameters. Holds nothing beyond the assignment:
// a cancelled or lost assignment leaves no state behind.
#ifndef GPIPE_WORKER_EXECUTOR_H_
#define GPIPE_WORKER_EXECUTOR_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "gpipe/v1/controller.pb.h"
#include "services/telemetry/stage_metrics.h"
#include "services/tensor/dtype.h"
#include "services/transport/grpc_link.h"

namespace gpipe {

class Executor {
 public:
  using Reporter = std::function<void(const gpipe::v1::WorkerMessage&)>;
  // `threads`: compute threads for the stage; `report` sends progress,
  // completion and failure to the controller; `metrics` (optional, not
  // owned) receives each step's figures and the links' traffic; `device`:
  // where stages compute.
  Executor(int threads, Reporter report, PipelineMetrics* metrics = nullptr,
           Device device = Device::kCpu);
  ~Executor();  // cancels and joins the running assignment

  // Starts `a`, cancelling whatever ran before.
  void Start(const gpipe::v1::Assignment& a);
  // Cancels the assignment of (job, epoch) if it is the current one.
  void Cancel(const std::string& job_id, int64_t epoch);
  void CancelAll();

  // The Exchange handler offers the server end of an upstream link. Waits up
  // to `wait_ms` for a matching assignment (it may still be on its way from
  // the controller); rejects frames of another job or an older epoch.
  // `stream_key`: what the stream presented, checked against the
  // assignment's key (PERMISSION_DENIED); nullopt: not checked.
  absl::Status AcceptUpstream(
      const std::string& job_id, int64_t epoch, int64_t from_stage,
      std::shared_ptr<GrpcLink> link, int64_t wait_ms,
      const std::optional<std::string>& stream_key = std::nullopt);

  bool busy() const;

  // Sends the stage's op timeline of every n-th step to the controller (a
  // StepTrace before the step's progress report); 0: none. Set before the
  // first Start.
  void set_trace_every(int64_t n) { trace_every_ = n; }
  // TLS for the downstream Exchange client (the assignment's stream key is
  // added per link). Set before the first Start.
  void set_exchange_credentials(ExchangeCredentials c) {
    exchange_credentials_ = std::move(c);
  }
  // The data planes this worker offers its next stage and accepts from its
  // previous one (--data_plane). Set before the first Start.
  void set_data_plane(const DataPlaneOptions& o) { data_plane_ = o; }
  const DataPlaneOptions& data_plane() const { return data_plane_; }

 private:
  struct Run;  // one assignment's state
  void Execute(std::shared_ptr<Run> run);
  absl::StatusOr<DataPlane> AwaitDataPlane(
      GrpcClientLink& link, const gpipe::v1::Assignment& a,
      const std::function<bool()>& cancelled,
      const std::shared_ptr<StageMetrics>& metrics);
  void StopLocked(std::unique_lock<std::mutex>& lock);

  const int threads_;
  Reporter report_;
  PipelineMetrics* const metrics_;
  int64_t trace_every_ = 1;
  ExchangeCredentials exchange_credentials_;
  DataPlaneOptions data_plane_;
  const Device device_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Run> current_;
  std::thread thread_;
};

}  // namespace gpipe

#endif  // GPIPE_WORKER_EXECUTOR_H_
