// Stage files through the controller (CHECKPOINT_TRANSPORT_CONTROLLER), so
// a worker needs no disk and shares none: a checkpoint or final file is
// encoded straight into an UploadStageFile stream (chunks of 1 MiB, sha256
// last), and a restoring stage decodes FetchCheckpoint's stream straight
// into tensors, checking each file's size and sha256 against its manifest.
// Neither side holds a whole file beside the tensors.
#ifndef GPIPE_WORKER_CONTROLLER_FILE_STORE_H_
#define GPIPE_WORKER_CONTROLLER_FILE_STORE_H_

#include <memory>
#include <string>

#include "gpipe/v1/controller.grpc.pb.h"
#include "grpcpp/channel.h"
#include "services/security/client_security.h"
#include "worker/stage_file_store.h"

namespace gpipe {

// The first message of an upload of `a`'s stage file of `bytes` bytes: its
// checkpoint after `step` steps, or (`final`) its final parameters.
gpipe::v1::StageFileHeader UploadHeader(const gpipe::v1::Assignment& a,
                                        int64_t step, bool final,
                                        int64_t bytes);

class ControllerFileStore final : public StageFileStore {
 public:
  // `channel`: to the controller, with `security`'s TLS; `security` adds
  // the worker token to each call.
  ControllerFileStore(std::shared_ptr<grpc::ChannelInterface> channel,
                      security::ClientSecurity security);

  absl::StatusOr<Stored> SaveCheckpoint(const gpipe::v1::Assignment& a,
                                        Stage& stage, int64_t step) override;
  absl::StatusOr<Stored> SaveFinal(const gpipe::v1::Assignment& a,
                                   Stage& stage) override;
  absl::StatusOr<int64_t> Restore(const gpipe::v1::Assignment& a,
                                  Stage& stage) override;

 private:
  absl::StatusOr<Stored> Upload(const gpipe::v1::Assignment& a, Stage& stage,
                                int64_t step, bool final);
  absl::StatusOr<int64_t> RestoreOnce(const gpipe::v1::Assignment& a,
                                      Stage& stage);

  std::unique_ptr<gpipe::v1::Controller::Stub> stub_;
  const security::ClientSecurity security_;
};

}  // namespace gpipe

#endif  // GPIPE_WORKER_CONTROLLER_FILE_STORE_H_
