// The dimensions of a tensor, outermost first.
#ifndef GPIPE_SERVICES_TENSOR_SHAPE_H_
#define GPIPE_SERVICES_TENSOR_SHAPE_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace gpipe {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t back() const { return dims_.back(); }
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }

  // The same shape with `n` in front: a per-sample shape made a batch shape.
  Shape WithBatch(int64_t n) const;
  // Drops the leading dimension.
  Shape WithoutBatch() const;

  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }
  std::string ToString() const;  // "[2, 3]"

 private:
  std::vector<int64_t> dims_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_SHAPE_H_
