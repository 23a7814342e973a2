// Element types and devices a tensor can have.
#ifndef GPIPE_SERVICES_TENSOR_DTYPE_H_
#define GPIPE_SERVICES_TENSOR_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gpipe {

enum class DType : uint8_t { kF32, kI32 };
enum class Device : uint8_t { kCpu, kCuda };

inline size_t DTypeSize(DType t) { return 4; }
inline std::string_view DTypeName(DType t) {
  return t == DType::kF32 ? "float32" : "int32";
}
inline std::string_view DeviceName(Device d) {
  return d == Device::kCpu ? "cpu" : "cuda";
}

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_DTYPE_H_
