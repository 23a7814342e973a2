// Comparison of secrets (bearer tokens, stream keys) whose running time does
// not depend on where the first differing byte is, so a caller cannot
// recover a secret one byte at a time by timing rejections.
#ifndef GPIPE_SERVICES_SECURITY_CONSTANT_TIME_H_
#define GPIPE_SERVICES_SECURITY_CONSTANT_TIME_H_

#include <string_view>

namespace gpipe::security {

// Whether `a` and `b` hold the same bytes. The time depends only on the
// lengths (a length mismatch is not a secret worth hiding: tokens and keys
// are of public, fixed formats).
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace gpipe::security

#endif  // GPIPE_SERVICES_SECURITY_CONSTANT_TIME_H_
