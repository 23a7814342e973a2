// Writing what FetchModel streams (a model, or a checkpoint's manifest and
// files) into a directory, checked: a file appears under its name only when
// every byte its header announced arrived and its sha256 is the one the
// controller computed; nothing else is left behind.
#ifndef GPIPE_CLI_MODEL_DOWNLOAD_H_
#define GPIPE_CLI_MODEL_DOWNLOAD_H_

#include <cstdint>
#include <string>
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

// Reads messages with `read` (false: the stream ended) into files of `dir`
// (created). A name that is not a plain file name, a stream that ends inside
// a file, more or fewer bytes than announced, or a digest that differs is
// an error (InvalidArgument, Aborted, DataLoss) that removes every file this
// call wrote, finished ones included.
absl::StatusOr<std::vector<DownloadedFile>> ReceiveModelFiles(
    absl::FunctionRef<bool(gpipe::v1::FetchModelResponse*)> read,
    const std::string& dir);

}  // namespace gpipe::cli

#endif  // GPIPE_CLI_MODEL_DOWNLOAD_H_
