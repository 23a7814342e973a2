#include "services/data/sampler.h"

#include <cassert>
#include <numeric>
#include <utility>

#include "services/core/rng.h"

namespace gpipe {

Sampler::Sampler(uint64_t seed, int64_t dataset_size, int64_t batch_size)
    : seed_(seed), dataset_size_(dataset_size), batch_size_(batch_size) {
  assert(dataset_size > 0 && batch_size > 0);
}

int64_t Sampler::Epoch(int64_t step) const {
  return step * batch_size_ / dataset_size_;
}

std::shared_ptr<const Sampler::Permutation> Sampler::PermutationOf(
    int64_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Cached& c : cache_) {
      if (c.epoch == epoch) return c.permutation;
    }
  }
  // Shuffle outside the lock; two threads may both compute the same epoch,
  // which is wasted work but gives the same permutation.
  auto p = std::make_shared<Permutation>(dataset_size_);
  std::iota(p->begin(), p->end(), int64_t{0});
  Rng rng(MixKey({seed_, static_cast<uint64_t>(epoch)}));
  for (int64_t i = dataset_size_ - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.Below(i + 1));
    std::swap((*p)[i], (*p)[j]);
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Evict the older of the two epochs.
  Cached& slot = cache_[0].epoch < cache_[1].epoch ? cache_[0] : cache_[1];
  slot = Cached{epoch, std::move(p)};
  return slot.permutation;
}

std::vector<int64_t> Sampler::Indices(int64_t step) const {
  assert(step >= 0);
  std::vector<int64_t> indices(batch_size_);
  std::shared_ptr<const Permutation> p;
  int64_t epoch = -1;
  for (int64_t i = 0; i < batch_size_; ++i) {
    const int64_t g = step * batch_size_ + i;
    if (g / dataset_size_ != epoch) {
      epoch = g / dataset_size_;
      p = PermutationOf(epoch);
    }
    indices[i] = (*p)[g % dataset_size_];
  }
  return indices;
}

}  // namespace gpipe
