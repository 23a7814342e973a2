#include "services/telemetry/port_file.h"

#include "absl/strings/str_cat.h"
#include "services/storage/file_io.h"

namespace gpipe {

absl::Status WritePortFile(const std::string& path, int port) {
  absl::Status s = storage::WriteFileAtomically(path, absl::StrCat(port, "\n"));
  return s.ok() ? s : absl::UnavailableError(s.message());
}

}  // namespace gpipe
