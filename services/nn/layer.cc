#include "services/nn/layer.h"

#include <cassert>

namespace gpipe {

void Saved::Put(std::string_view name, Tensor t) {
  for (auto& [n, kept] : tensors_) {
    if (n == name) {
      kept = std::move(t);
      return;
    }
  }
  tensors_.emplace_back(std::string(name), std::move(t));
}

const Tensor& Saved::Get(std::string_view name) const {
  for (const auto& [n, kept] : tensors_) {
    if (n == name) return kept;
  }
  assert(false && "a layer's backward asked for a tensor it did not save");
  static const Tensor kNone;
  return kNone;
}

void Saved::Drop(std::string_view name) {
  for (auto it = tensors_.begin(); it != tensors_.end(); ++it) {
    if (it->first == name) {
      tensors_.erase(it);
      return;
    }
  }
}

int64_t Saved::bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.defined() ? t.nbytes() : 0;
  for (const Saved& c : children) n += c.bytes();
  return n;
}

}  // namespace gpipe
