#include "services/tensor/tensor.h"

#include <atomic>
#include <cassert>
#include <cstring>

#include "services/tensor/denormals.h"
#include "services/tensor/device.h"

namespace gpipe {
namespace {
// Before main, on the process's first thread, so that every thread made
// after it inherits the mode (threads.h). Here because every process that
// computes links the tensor.
[[gnu::constructor]] void FlushDenormalsInEveryThread() {
  FlushDenormalsOnThisThread();
}
}  // namespace

struct Tensor::Buffer {
  Buffer(Allocator* a, size_t n) : allocator(a), bytes(n) {
    data = allocator->Allocate(bytes);
  }
  ~Buffer() {
    allocator->Deallocate(data, bytes);
    if (CountingAllocator* c = counted_in.load()) {
      c->Charge(-static_cast<int64_t>(bytes));
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Allocator* allocator;
  size_t bytes;
  void* data;
  // The receiver that counts this storage besides its allocator (CountIn).
  std::atomic<CountingAllocator*> counted_in{nullptr};
  // Tensor::writes().
  std::atomic<uint64_t> writes{0};
};

Tensor Tensor::Empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  ThrowIfAllocationCancelled();
  Allocator* a = CurrentAllocator(device);
  assert(a != nullptr && "no allocator for the device (no CUDA backend?)");
  t.buffer_ = std::make_shared<Buffer>(a, shape.numel() * DTypeSize(dtype));
  return t;
}

Tensor Tensor::Zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = Empty(shape, dtype, device);
  t.SetZero();
  return t;
}

Tensor Tensor::Filled(const Shape& shape, float value) {
  Tensor t = Empty(shape);
  float* p = t.f32();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = value;
  return t;
}

Tensor Tensor::FromVector(const Shape& shape, const std::vector<float>& v) {
  assert(static_cast<int64_t>(v.size()) == shape.numel());
  Tensor t = Empty(shape);
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(float));
  return t;
}

Tensor Tensor::FromInts(const Shape& shape, const std::vector<int32_t>& v) {
  assert(static_cast<int64_t>(v.size()) == shape.numel());
  Tensor t = Empty(shape, DType::kI32);
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

Device Tensor::device() const {
  return buffer_ ? buffer_->allocator->device() : Device::kCpu;
}

void Tensor::CountIn(Allocator* current) {
  if (buffer_ == nullptr || current == nullptr) return;
  CountingAllocator* counter = current->counting();
  if (counter == nullptr || buffer_->allocator == current) return;
  CountingAllocator* none = nullptr;
  if (buffer_->counted_in.compare_exchange_strong(none, counter)) {
    counter->Charge(static_cast<int64_t>(buffer_->bytes));
  }
}

void* Tensor::raw() {
  if (!buffer_) return nullptr;
  buffer_->writes.fetch_add(1, std::memory_order_relaxed);
  return static_cast<char*>(buffer_->data) + offset_;
}

uint64_t Tensor::writes() const {
  return buffer_ ? buffer_->writes.load(std::memory_order_relaxed) : 0;
}
const void* Tensor::raw() const {
  return buffer_ ? static_cast<const char*>(buffer_->data) + offset_ : nullptr;
}

Tensor Tensor::Reshape(const Shape& shape) const {
  assert(shape.numel() == numel());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  assert(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0));
  const int64_t row = dim(0) > 0 ? numel() / dim(0) : 0;
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.offset_ += begin * row * DTypeSize(dtype_);
  return t;
}

Tensor Tensor::Clone() const {
  if (!defined()) return Tensor();
  const Device d = device();
  Tensor t = Empty(shape_, dtype_, d);
  if (d == Device::kCpu) {
    std::memcpy(t.raw(), raw(), nbytes());
  } else {
    CopyBytes(t.raw(), d, raw(), d, nbytes());
  }
  return t;
}

Tensor Tensor::To(Device target) const {
  if (!defined() || device() == target) return *this;
  Tensor t = Empty(shape_, dtype_, target);
  CopyBytes(t.raw(), target, raw(), device(), nbytes());
  return t;
}

void Tensor::SetZero() {
  if (!defined()) return;
  if (device() == Device::kCpu) {
    std::memset(raw(), 0, nbytes());
  } else {
    ZeroBytes(raw(), device(), nbytes());
  }
}

void Tensor::CopyFrom(const Tensor& other) {
  assert(other.numel() == numel() && other.dtype() == dtype());
  if (device() == Device::kCpu && other.device() == Device::kCpu) {
    std::memcpy(raw(), other.raw(), nbytes());
  } else {
    CopyBytes(raw(), device(), other.raw(), other.device(), nbytes());
  }
}

std::vector<float> Tensor::ToVector() const {
  if (device() != Device::kCpu) return To(Device::kCpu).ToVector();
  std::vector<float> v(numel());
  if (dtype_ == DType::kF32) {
    std::memcpy(v.data(), raw(), nbytes());
  } else {
    for (int64_t i = 0; i < numel(); ++i) v[i] = static_cast<float>(i32()[i]);
  }
  return v;
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  if (a.device() != Device::kCpu || b.device() != Device::kCpu)
    return BitwiseEqual(a.To(Device::kCpu), b.To(Device::kCpu));
  return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace gpipe
