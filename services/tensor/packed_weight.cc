#include "services/tensor/packed_weight.h"

#include <cassert>

namespace gpipe {

void PackedWeight::Multiply(bool trans, int64_t m, int64_t n, int64_t k,
                            const float* a, const Tensor& w, float* c) {
  std::lock_guard<std::mutex> lock(mu_);
  PrepareLocked(trans, n, k, w);
  cpu::GemmPackedB(m, 1.0f, a, k, packed_, 0.0f, c, n);
}

void PackedWeight::Prepare(bool trans, int64_t n, int64_t k, const Tensor& w) {
  std::lock_guard<std::mutex> lock(mu_);
  PrepareLocked(trans, n, k, w);
}

void PackedWeight::PrepareLocked(bool trans, int64_t n, int64_t k,
                                 const Tensor& w) {
  assert(w.device() == Device::kCpu && w.numel() == n * k);
  const bool current = packed_.packed() && source_.SameStorage(w) &&
                       source_writes_ == w.writes() && trans_ == trans &&
                       packed_.k() == k && packed_.n() == n &&
                       &packed_.tile() == &cpu::BestGemmTile();
  if (!current) {
    // writes() first: a write that lands while packing then packs again.
    source_writes_ = w.writes();
    source_ = w;
    trans_ = trans;
    packed_.Pack(trans, k, n, w.f32(), trans ? k : n);
    ++packs_;
  }
}

void PackedWeight::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  packed_.Clear();
  source_ = Tensor();
}

int64_t PackedWeight::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return packed_.bytes();
}

int64_t PackedWeight::packs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return packs_;
}

}  // namespace gpipe
