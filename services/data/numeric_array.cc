#include "services/data/numeric_array.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/core/strings.h"

namespace gpipe {
namespace {

// The bytes are little-endian; copying them into a host value is only right
// on a little-endian host, which is all we build for.
static_assert(std::endian::native == std::endian::little);

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// IEEE half precision, subnormals and all.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) |
                              (mantissa << 13));
}

// Where flat index `i` lies, for messages: "flat index 40 (sample 5)".
std::string Position(const NumericArray& a, int64_t i) {
  if (a.shape.size() == 1) return absl::StrCat("sample ", i);
  if (a.shape.size() < 2) return absl::StrCat("flat index ", i);
  const int64_t per_sample = a.shape[0] == 0 ? 1 : a.numel() / a.shape[0];
  return absl::StrCat("flat index ", i, " (sample ", i / per_sample, ")");
}

// Calls f(i, value) with each element as double (floats) or int64/uint64
// (integers), stopping at the first error f returns.
template <typename F>
absl::Status ForEach(const NumericArray& a, F&& f) {
  const int64_t n = a.numel();
  const uint8_t* p = a.data.data();
  const size_t size = ElementSize(a.type);
  for (int64_t i = 0; i < n; ++i, p += size) {
    absl::Status s;
    switch (a.type) {
      case ElementType::kBool:
        s = f(i, int64_t{*p != 0});
        break;
      case ElementType::kU8:
        s = f(i, int64_t{Load<uint8_t>(p)});
        break;
      case ElementType::kI8:
        s = f(i, int64_t{Load<int8_t>(p)});
        break;
      case ElementType::kU16:
        s = f(i, int64_t{Load<uint16_t>(p)});
        break;
      case ElementType::kI16:
        s = f(i, int64_t{Load<int16_t>(p)});
        break;
      case ElementType::kU32:
        s = f(i, int64_t{Load<uint32_t>(p)});
        break;
      case ElementType::kI32:
        s = f(i, int64_t{Load<int32_t>(p)});
        break;
      case ElementType::kU64:
        s = f(i, Load<uint64_t>(p));
        break;
      case ElementType::kI64:
        s = f(i, Load<int64_t>(p));
        break;
      case ElementType::kF16:
        s = f(i, double{HalfToFloat(Load<uint16_t>(p))});
        break;
      case ElementType::kBF16:
        // bfloat16 is the top half of a float32.
        s = f(i,
              double{std::bit_cast<float>(uint32_t{Load<uint16_t>(p)} << 16)});
        break;
      case ElementType::kF32:
        s = f(i, double{Load<float>(p)});
        break;
      case ElementType::kF64:
        s = f(i, Load<double>(p));
        break;
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kBool:
      return "bool";
    case ElementType::kU8:
      return "uint8";
    case ElementType::kI8:
      return "int8";
    case ElementType::kU16:
      return "uint16";
    case ElementType::kI16:
      return "int16";
    case ElementType::kU32:
      return "uint32";
    case ElementType::kI32:
      return "int32";
    case ElementType::kU64:
      return "uint64";
    case ElementType::kI64:
      return "int64";
    case ElementType::kF16:
      return "float16";
    case ElementType::kBF16:
      return "bfloat16";
    case ElementType::kF32:
      return "float32";
    case ElementType::kF64:
      return "float64";
  }
  return "unknown";
}

size_t ElementSize(ElementType type) {
  switch (type) {
    case ElementType::kBool:
    case ElementType::kU8:
    case ElementType::kI8:
      return 1;
    case ElementType::kU16:
    case ElementType::kI16:
    case ElementType::kF16:
    case ElementType::kBF16:
      return 2;
    case ElementType::kU32:
    case ElementType::kI32:
    case ElementType::kF32:
      return 4;
    case ElementType::kU64:
    case ElementType::kI64:
    case ElementType::kF64:
      return 8;
  }
  return 1;
}

bool IsFloating(ElementType type) {
  return type == ElementType::kF16 || type == ElementType::kBF16 ||
         type == ElementType::kF32 || type == ElementType::kF64;
}

int64_t NumericArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<int64_t> CheckedNumel(const std::vector<int64_t>& shape,
                                     size_t element_size) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  // Nonzero dimensions must multiply within int64 even when another is 0,
  // so no later product over a sub-shape can overflow either.
  int64_t nonzero = 1;
  bool has_zero = false;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ShapeToString(shape), " has a negative dimension"));
    }
    if (d == 0) {
      has_zero = true;
    } else if (nonzero > kMax / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ShapeToString(shape), " has too many elements"));
    } else {
      nonzero *= d;
    }
  }
  if (nonzero > kMax / static_cast<int64_t>(element_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeToString(shape), " has too many bytes"));
  }
  return has_zero ? 0 : nonzero;
}

absl::StatusOr<std::vector<float>> ToFloat32(const NumericArray& array) {
  std::vector<float> out(static_cast<size_t>(array.numel()));
  absl::Status s = ForEach(array, [&](int64_t i, auto v) -> absl::Status {
    const float f = static_cast<float>(v);
    if constexpr (std::is_floating_point_v<decltype(v)>) {
      if (!std::isfinite(f)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "value ", v,
            std::isfinite(v) ? " is beyond float32's range" : " is not finite",
            " at ", Position(array, i)));
      }
    }
    out[i] = f;
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<int32_t>> ToInt32(const NumericArray& array,
                                             std::string_view what) {
  if (IsFloating(array.type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be integer ", AsAbsl(what), ", got ",
                     AsAbsl(ElementTypeName(array.type))));
  }
  std::vector<int32_t> out(static_cast<size_t>(array.numel()));
  absl::Status s = ForEach(array, [&](int64_t i, auto v) -> absl::Status {
    if constexpr (std::is_floating_point_v<decltype(v)>) {
      return absl::InternalError("unreachable: floats were refused above");
    } else {
      if (std::cmp_less(v, std::numeric_limits<int32_t>::min()) ||
          std::cmp_greater(v, std::numeric_limits<int32_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "value ", v, " at ", Position(array, i), " does not fit int32"));
      }
      out[i] = static_cast<int32_t>(v);
      return absl::OkStatus();
    }
  });
  if (!s.ok()) return s;
  return out;
}

}  // namespace gpipe
