// A dense, contiguous, row-major tensor. Copies share storage (like a
// shared_ptr); Clone() makes a deep copy. Memory comes from the allocator
// current on the creating thread, so a stage's activations are counted.
#ifndef GPIPE_SERVICES_TENSOR_TENSOR_H_
#define GPIPE_SERVICES_TENSOR_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "services/tensor/allocator.h"
#include "services/tensor/dtype.h"
#include "services/tensor/shape.h"

namespace gpipe {

class Tensor {
 public:
  Tensor() = default;

  // Uninitialized memory of `shape` on `device` (from the thread's current
  // allocator of that device).
  static Tensor Empty(const Shape& shape, DType dtype = DType::kF32,
                      Device device = Device::kCpu);
  static Tensor Zeros(const Shape& shape, DType dtype = DType::kF32,
                      Device device = Device::kCpu);
  static Tensor Filled(const Shape& shape, float value);
  static Tensor FromVector(const Shape& shape, const std::vector<float>& v);
  static Tensor FromInts(const Shape& shape, const std::vector<int32_t>& v);

  bool defined() const { return buffer_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.rank() + i : i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return numel() * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const;

  float* f32() { return static_cast<float*>(raw()); }
  const float* f32() const { return static_cast<const float*>(raw()); }
  int32_t* i32() { return static_cast<int32_t*>(raw()); }
  const int32_t* i32() const { return static_cast<const int32_t*>(raw()); }
  // Non-const access counts as a write (writes()), whether or not the
  // caller writes: read through a const tensor where nothing is written.
  void* raw();
  const void* raw() const;

  // How many times this storage was handed out for writing (non-const
  // f32(), i32(), raw(), CopyFrom, SetZero): unchanged between two calls
  // means the bytes are too. What derives from the bytes keeps this to know
  // when to derive it again (a weight packed for the GEMM: PackedWeight).
  uint64_t writes() const;
  // The same storage and offset: the same bytes, not merely equal ones.
  bool SameStorage(const Tensor& other) const {
    return buffer_ == other.buffer_ && offset_ == other.offset_;
  }

  // Same storage, another shape with the same number of elements.
  Tensor Reshape(const Shape& shape) const;
  // Rows [begin, end) of the leading dimension, sharing storage.
  Tensor Rows(int64_t begin, int64_t end) const;
  Tensor Clone() const;  // on the same device
  // This tensor on `device`: itself when it is already there, else a copy.
  Tensor To(Device device) const;
  void SetZero();
  void CopyFrom(const Tensor& other);  // same numel and dtype, any devices

  // The elements on the host (copied back from a device).
  std::vector<float> ToVector() const;

  // Makes `current` (a thread's current allocator) count this tensor's
  // storage as held until the storage is freed, when `current` counts
  // (Allocator::counting) and another allocator provided the storage: a
  // tensor a link received on its reader thread, or one lent by a
  // shared-memory ring, then counts as the receiving stage's activation
  // memory, as one allocated on the stage's thread does. No-op when the
  // storage came from `current` or is counted by a receiver already.
  // `current` must outlive the storage, as an allocator must outlive what
  // it allocated: a stage keeps what it receives only within a step.
  void CountIn(Allocator* current);

 private:
  struct Buffer;
  std::shared_ptr<Buffer> buffer_;
  size_t offset_ = 0;  // in bytes
  Shape shape_;
  DType dtype_ = DType::kF32;
};

// True when both have the same shape, dtype and bytes (on any devices).
bool BitwiseEqual(const Tensor& a, const Tensor& b);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_TENSOR_H_
