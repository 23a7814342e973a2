// Writing what FetchModel streams (a model, or a checkpoint's manifest and
// files) into a directory, checked: files appear under their names only when
// every byte each header announced arrived, each sha256 is the one the
// controller computed and the stream ended well; nothing else is left behind.
#ifndef GPIPE_CLI_MODEL_DOWNLOAD_H_
#define GPIPE_CLI_MODEL_DOWNLOAD_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "gpipe/v1/controller.pb.h"

namespace gpipe::cli {

struct DownloadedFile {
  std::string path;
  int64_t bytes = 0;
  std::string sha256;
};

// Files received and checked, each still under NAME.part beside its final
// name; they take their names together, once the whole stream has arrived
// and the controller has ended it well (Commit). Dropped uncommitted, it
// removes them: a failed fetch leaves what the directory held before,
// files of an earlier fetch of the same checkpoint included.
class ReceivedFiles {
 public:
  ReceivedFiles() = default;
  ReceivedFiles(ReceivedFiles&& o) noexcept
      : files_(std::move(o.files_)),
        created_dir_(std::move(o.created_dir_)),
        created_top_(std::move(o.created_top_)) {
    o.files_.clear();
    o.created_dir_.clear();
    o.created_top_.clear();
  }
  ReceivedFiles& operator=(ReceivedFiles&&) = delete;
  ReceivedFiles(const ReceivedFiles&) = delete;
  ReceivedFiles& operator=(const ReceivedFiles&) = delete;
  ~ReceivedFiles();

  // Renames every file into place (Internal naming it when one cannot be).
  absl::StatusOr<std::vector<DownloadedFile>> Commit();

  void Add(std::string part, DownloadedFile file) {
    files_.emplace_back(std::move(part), std::move(file));
  }
  // The folders the stream created, `dir` up to `top` (the highest that was
  // not there): removed again, each when empty, unless the files are
  // committed, so a failed fetch leaves no trace.
  void CreatedDirs(std::string dir, std::string top) {
    created_dir_ = std::move(dir);
    created_top_ = std::move(top);
  }

 private:
  std::vector<std::pair<std::string, DownloadedFile>> files_;  // part, file
  std::string created_dir_, created_top_;
};

// Reads messages with `read` (false: the stream ended) into files of `dir`
// (created with the first file, not before: a refused fetch makes no
// folder). A name that is not a plain file name, a stream that ends inside
// a file, more or fewer bytes than announced, or a digest that differs is
// an error (InvalidArgument, Aborted, DataLoss) that removes every file this
// call wrote, finished ones included; it never touches another file.
absl::StatusOr<ReceivedFiles> ReceiveModelFiles(
    absl::FunctionRef<bool(gpipe::v1::FetchModelResponse*)> read,
    const std::string& dir);

}  // namespace gpipe::cli

#endif  // GPIPE_CLI_MODEL_DOWNLOAD_H_
