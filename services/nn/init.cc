#include "services/nn/init.h"

#include "services/core/rng.h"
#include "services/nn/layer.h"

namespace gpipe {

void InitUniform(Tensor& t, uint64_t key, float bound) {
  Rng rng(key);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<float>((2.0 * rng.Uniform() - 1.0) * bound);
}

void InitNormal(Tensor& t, uint64_t key, float stddev) {
  Rng rng(key);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<float>(rng.Normal() * stddev);
}

Parameter MakeParameter(std::string name, const Shape& shape, bool decay) {
  // Parameters live for the whole run; they are not activations, so they are
  // not charged to whichever stage allocator happens to be current.
  AllocatorScope scope(DefaultCpuAllocator());
  return Parameter{std::move(name), Tensor::Zeros(shape), Tensor::Zeros(shape),
                   decay};
}

}  // namespace gpipe
