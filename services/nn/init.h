// Deterministic parameter initialization from a counter-based key.
#ifndef GPIPE_SERVICES_NN_INIT_H_
#define GPIPE_SERVICES_NN_INIT_H_

#include <cstdint>
#include <string>

#include "services/tensor/tensor.h"

namespace gpipe {

// Uniform in [-bound, bound), drawn from Rng(key).
void InitUniform(Tensor& t, uint64_t key, float bound);
// Normal(0, stddev), drawn from Rng(key).
void InitNormal(Tensor& t, uint64_t key, float stddev);
// A Parameter made of zeros with a zeroed gradient of the same shape.
struct Parameter;
Parameter MakeParameter(std::string name, const Shape& shape, bool decay);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_INIT_H_
