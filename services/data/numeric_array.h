// A numeric array as a file stores it (.npy, one tensor of a .safetensors):
// its element type, shape and raw little-endian bytes, and the checked
// conversions to the two dtypes a model takes. Kept apart from the readers
// so both formats share one set of conversion rules and messages.
#ifndef GPIPE_SERVICES_DATA_NUMERIC_ARRAY_H_
#define GPIPE_SERVICES_DATA_NUMERIC_ARRAY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpipe {

enum class ElementType {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kU64,
  kI64,
  kF16,
  kBF16,
  kF32,
  kF64,
};

// NumPy's name for it: "float32", "int64", "bool", "bfloat16".
std::string_view ElementTypeName(ElementType type);
size_t ElementSize(ElementType type);
bool IsFloating(ElementType type);

// Row-major (C order) elements, little-endian whatever the file said.
struct NumericArray {
  ElementType type = ElementType::kF32;
  std::vector<int64_t> shape;  // empty for a scalar
  std::vector<uint8_t> data;   // numel() * ElementSize(type) bytes

  int64_t numel() const;  // shape was checked not to overflow when read
};

// "[2, 3]", or "[]" for a scalar.
std::string ShapeToString(const std::vector<int64_t>& shape);

// The product of `shape`, or InvalidArgument when a dimension is negative
// or the product (or its size in bytes of `element_size` each) overflows
// int64: readers call it on shapes read from files, before allocating.
absl::StatusOr<int64_t> CheckedNumel(const std::vector<int64_t>& shape,
                                     size_t element_size);

// Every element as float32. Integers convert as C++ does (large int64
// values round); a value that is not finite as a float32 (NaN, inf, or a
// float64 beyond float32's range) is InvalidArgument naming its flat index
// and, for arrays of rank 2 and more, its sample (index along the first
// dimension).
absl::StatusOr<std::vector<float>> ToFloat32(const NumericArray& array);

// Every element as int32, for arrays of integers or bools. A floating array
// is InvalidArgument "must be integer <what>, got float32"; a value outside
// int32 names its flat index and sample as ToFloat32 does.
absl::StatusOr<std::vector<int32_t>> ToInt32(const NumericArray& array,
                                             std::string_view what);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_NUMERIC_ARRAY_H_
