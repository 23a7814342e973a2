// Per-assignment stream keys: the controller makes a random key for each
// (job, epoch) and hands it to that epoch's stages in their Assignment; a
// stage opening Exchange to its downstream neighbour sends it in metadata,
// and the neighbour accepts the stream only when it is its own assignment's
// key. Whoever can reach a worker's Stage port but did not get the
// assignment from the controller cannot push tensors into a job.
#ifndef GPIPE_SERVICES_SECURITY_STREAM_KEY_H_
#define GPIPE_SERVICES_SECURITY_STREAM_KEY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpipe::security {

// Random bytes in a key (from OpenSSL's CSPRNG), sent as hex.
inline constexpr int kStreamKeyBytes = 32;

// A fresh key: 2 * kStreamKeyBytes lowercase hex digits. INTERNAL when the
// CSPRNG fails (it does not, once seeded from the kernel).
absl::StatusOr<std::string> NewStreamKey();

// OK when `presented` equals `expected` (constant time); PERMISSION_DENIED
// otherwise, with a message that holds neither key. An empty `expected`
// (an assignment from a controller without keys) accepts anything.
absl::Status CheckStreamKey(const std::string& expected,
                            const std::string& presented);

}  // namespace gpipe::security

#endif  // GPIPE_SERVICES_SECURITY_STREAM_KEY_H_
