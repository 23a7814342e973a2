// Which samples each training step sees. Epochs are Fisher-Yates shuffles
// keyed by (seed, epoch), and step s takes the global positions
// s*B .. s*B+B-1 of the endless concatenation of epochs: a pure function of
// (seed, step), so a restarted job resumes on exactly the same batches.
#ifndef GPIPE_SERVICES_DATA_SAMPLER_H_
#define GPIPE_SERVICES_DATA_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace gpipe {

class Sampler {
 public:
  // dataset_size and batch_size must be positive. A batch larger than the
  // dataset simply spans several epochs.
  Sampler(uint64_t seed, int64_t dataset_size, int64_t batch_size);

  // The dataset indices of step `step` (>= 0), batch_size of them.
  // Thread-safe; the answer never depends on earlier calls.
  std::vector<int64_t> Indices(int64_t step) const;
  // The epoch the first sample of `step` belongs to.
  int64_t Epoch(int64_t step) const;

  int64_t dataset_size() const { return dataset_size_; }
  int64_t batch_size() const { return batch_size_; }

 private:
  using Permutation = std::vector<int64_t>;
  std::shared_ptr<const Permutation> PermutationOf(int64_t epoch) const;

  uint64_t seed_;
  int64_t dataset_size_;
  int64_t batch_size_;

  // Steps walk forward through epochs, so the last two permutations serve
  // nearly every call; the rest are recomputed (the result is the same).
  struct Cached {
    int64_t epoch = -1;
    std::shared_ptr<const Permutation> permutation;
  };
  mutable std::mutex mu_;
  mutable Cached cache_[2];
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_SAMPLER_H_
