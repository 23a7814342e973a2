#include "services/nn/layer.h"

namespace gpipe {

int64_t Saved::bytes() const {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.defined() ? t.nbytes() : 0;
  for (const Saved& c : children) n += c.bytes();
  return n;
}

}  // namespace gpipe
