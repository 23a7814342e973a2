// The checkpoint bench's second path: stage files through the controller
// (--checkpoint_transport controller), the real code on both sides. A
// controller serves on loopback with its checkpoint directory beside the
// shared-path files; one Attach stream stands in for the worker so that a
// one-stage job runs and its assignment carries a stream key; then the
// worker's ControllerFileStore uploads checkpoints (the controller writes,
// fsyncs and renames them) and fetches them back after their commit.
#ifndef GPIPE_BENCH_CHECKPOINT_TRANSPORT_H_
#define GPIPE_BENCH_CHECKPOINT_TRANSPORT_H_

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "controller/controller_server.h"
#include "gpipe/v1/controller.grpc.pb.h"
#include "services/pipeline/stage.h"
#include "worker/controller_file_store.h"

namespace gpipe::bench {

class ControllerTransportRig {
 public:
  // A controller on 127.0.0.1:0 keeping files under `dir`, running `spec`
  // (one stage, a checkpoint every step) on the rig's stand-in worker.
  static absl::StatusOr<std::unique_ptr<ControllerTransportRig>> Start(
      const std::filesystem::path& dir, const gpipe::v1::JobSpec& spec);
  ~ControllerTransportRig();

  const gpipe::v1::Assignment& assignment() const { return assignment_; }

  // Uploads the stage's checkpoint after `step` steps.
  absl::StatusOr<StageFileStore::Stored> Upload(Stage& stage, int64_t step);
  // Reports it and waits for the controller to commit it.
  absl::Status Commit(int64_t step, const StageFileStore::Stored& stored);
  // Fetches the committed checkpoint of `step` into `stage`.
  absl::StatusOr<int64_t> Fetch(Stage& stage, int64_t step);

 private:
  ControllerTransportRig() = default;

  std::unique_ptr<controller::ControllerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<gpipe::v1::Controller::Stub> stub_;
  grpc::ClientContext attach_context_;
  std::unique_ptr<grpc::ClientReaderWriter<gpipe::v1::WorkerMessage,
                                           gpipe::v1::ControllerMessage>>
      attach_;
  gpipe::v1::Assignment assignment_;
  std::string job_id_;
  std::unique_ptr<ControllerFileStore> files_;
};

}  // namespace gpipe::bench

#endif  // GPIPE_BENCH_CHECKPOINT_TRANSPORT_H_
