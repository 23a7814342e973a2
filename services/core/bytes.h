// Byte counts as people write and read them: flags such as --memory_limit
// 8GiB and messages such as "stage 2 needs 18.6 GiB".
#ifndef GPIPE_SERVICES_CORE_BYTES_H_
#define GPIPE_SERVICES_CORE_BYTES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpipe {

// "0", "1048576", "512MiB", "2GiB", "1.5GB", "64KB" (KiB/MiB/GiB/TiB are
// powers of 1024, KB/MB/GB/TB of 1000). `what` names the flag or field in
// the error, which quotes the text.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text,
                                   absl::string_view what);

// "512 B", "1.5 KiB", "18.6 GiB": three significant figures at most.
std::string FormatBytes(int64_t bytes);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_BYTES_H_
