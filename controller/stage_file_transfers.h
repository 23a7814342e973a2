// The bytes of stage files through the controller
// (CHECKPOINT_TRANSPORT_CONTROLLER): an upload is written to disk as it
// arrives and becomes visible under its final name only when every byte
// came and the sender's sha256 matched; a fetch streams a committed
// checkpoint's files, read from disk in chunks. Neither holds a whole file
// in memory: each transfer holds one chunk, and at most `max_concurrent`
// run at once (the others wait for a slot), so several stages uploading
// together stay within a bounded buffer. The controller's lock is never
// held here: who may transfer what is decided before (Controller::
// StageFileDestination, CheckpointToFetch).
#ifndef GPIPE_CONTROLLER_STAGE_FILE_TRANSFERS_H_
#define GPIPE_CONTROLLER_STAGE_FILE_TRANSFERS_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpipe/v1/controller.pb.h"

namespace gpipe::controller {

struct TransferOptions {
  int max_concurrent = 8;  // uploads and fetches at once; more wait
  // How long one waits for a slot before it is refused (ResourceExhausted).
  absl::Duration slot_wait = absl::Seconds(120);
  int64_t max_file_bytes = int64_t{1} << 40;  // larger uploads are refused
  int64_t chunk_bytes = int64_t{1} << 20;     // of a fetch's messages
};

class StageFileTransfers {
 public:
  explicit StageFileTransfers(TransferOptions options = {});

  // Receives one upload. `read(m)` reads the next message (false: the
  // stream ended); `destination(header)` is where the file goes, or why it
  // may not be uploaded. A stream that ends early, more or fewer bytes than
  // the header said, or a digest that does not match leave nothing behind
  // (Aborted, InvalidArgument, DataLoss); a full disk is ResourceExhausted
  // naming the file.
  absl::StatusOr<gpipe::v1::UploadStageFileResponse> Receive(
      absl::FunctionRef<bool(gpipe::v1::UploadStageFileRequest*)> read,
      absl::FunctionRef<
          absl::StatusOr<std::string>(const gpipe::v1::StageFileHeader&)>
          destination);

  // Sends the committed checkpoint at `manifest_path`: its manifest, then
  // each file holding some of layers [layer_begin, layer_end), entry first
  // and bytes after. `write` returns false when the client is gone
  // (Cancelled). A file that no longer matches its manifest ends the stream
  // with DataLoss (the receiver checks the digest too).
  absl::Status Send(
      const std::string& manifest_path, int64_t layer_begin, int64_t layer_end,
      absl::FunctionRef<bool(const gpipe::v1::FetchCheckpointResponse&)> write);

  // A file to send to a client: where it is, the name it gets, and the
  // sha256 it must have ("": whatever it has).
  struct FileToSend {
    std::string path;
    std::string name;
    std::string sha256;
  };
  // Sends `files` in order, each as header, bytes and the digest of the
  // bytes read (FetchModelResponse). A file whose digest is not the one
  // expected ends the stream with DataLoss before its digest is sent.
  absl::Status SendFiles(
      const std::vector<FileToSend>& files,
      absl::FunctionRef<bool(const gpipe::v1::FetchModelResponse&)> write);

  int active() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Slot;  // one of max_concurrent, held for a transfer's length
  // A destination being received, so that two uploads of one file (a
  // retry racing the original) never share a temporary file.
  class Claim;

  const TransferOptions options_;
  absl::Mutex mu_;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> receiving_ ABSL_GUARDED_BY(mu_);  // destinations
};

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_STAGE_FILE_TRANSFERS_H_
