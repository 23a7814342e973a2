#include "services/tensor/packed_weight.h"

#include <cassert>

namespace gpipe {

void PackedWeight::Multiply(bool trans, int64_t m, int64_t n, int64_t k,
                            const float* a, const Tensor& w, float* c,
                            const float* bias) {
  std::lock_guard<std::mutex> lock(mu_);
  SeeLocked(trans, n, k, w);
  ++uses_;
  rows_ = m;
  if (!pays_) {
    cpu::GemmAddBias(trans, m, n, k, a, k, w.f32(), trans ? k : n, bias, c, n);
    return;
  }
  PackLocked(trans, n, k, w, m);
  cpu::GemmPackedBAddBias(m, a, k, packed_, bias, c, n);
}

void PackedWeight::Prepare(bool trans, int64_t n, int64_t k, const Tensor& w) {
  std::lock_guard<std::mutex> lock(mu_);
  SeeLocked(trans, n, k, w);
  if (pays_) PackLocked(trans, n, k, w, rows_);
}

void PackedWeight::SeeLocked(bool trans, int64_t n, int64_t k,
                             const Tensor& w) {
  assert(w.device() == Device::kCpu && w.numel() == n * k);
  const bool same = source_.defined() && source_.SameStorage(w) &&
                    source_writes_ == w.writes() && trans_ == trans &&
                    n_ == n && k_ == k;
  if (same) return;
  // The version before it decides; the first one is packed.
  if (source_.defined()) pays_ = uses_ >= 2;
  // writes() first: a write that lands while packing then packs again.
  source_writes_ = w.writes();
  source_ = w;
  trans_ = trans;
  n_ = n;
  k_ = k;
  uses_ = 0;
  current_ = false;
  if (!pays_) packed_.Clear();  // the memory is better left unheld
}

void PackedWeight::PackLocked(bool trans, int64_t n, int64_t k, const Tensor& w,
                              int64_t rows) {
  if (current_ && &packed_.tile() == &cpu::BestGemmTile()) return;
  packed_.Pack(trans, k, n, w.f32(), trans ? k : n, rows);
  current_ = true;
  ++packs_;
}

void PackedWeight::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  packed_.Clear();
  source_ = Tensor();
  current_ = false;
  uses_ = 0;
  pays_ = true;
}

int64_t PackedWeight::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return packed_.bytes();
}

int64_t PackedWeight::packs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return packs_;
}

int64_t PackedWeight::depth_block() const {
  std::lock_guard<std::mutex> lock(mu_);
  return packed_.depth_block();
}

}  // namespace gpipe
