#include "services/tensor/shape.h"

#include "absl/strings/str_join.h"

namespace gpipe {

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

Shape Shape::WithBatch(int64_t n) const {
  std::vector<int64_t> d;
  d.reserve(dims_.size() + 1);
  d.push_back(n);
  d.insert(d.end(), dims_.begin(), dims_.end());
  return Shape(std::move(d));
}

Shape Shape::WithoutBatch() const {
  return Shape(std::vector<int64_t>(dims_.begin() + (dims_.empty() ? 0 : 1),
                                    dims_.end()));
}

std::string Shape::ToString() const {
  return "[" + absl::StrJoin(dims_, ", ") + "]";
}

}  // namespace gpipe
