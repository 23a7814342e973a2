// Optimizer updates, one pass over a parameter, its gradient and its state
// (PyTorch's SGD and AdamW arithmetic). Each element depends only on its own
// inputs, so vector lanes and threads never change the bits.
#ifndef GPIPE_SERVICES_TENSOR_CPU_OPTIMIZER_H_
#define GPIPE_SERVICES_TENSOR_CPU_OPTIMIZER_H_

#include <cstdint>

namespace gpipe::cpu {

// d = g + decay * w; buf = first ? d : mu * buf + d;
// w -= lr * (nesterov ? d + mu * buf : buf). With buf null (mu 0):
// w -= lr * d.
void SgdStep(int64_t n, float lr, float decay, float mu, bool nesterov,
             bool first, const float* g, float* w, float* buf);
// w *= decay; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// w -= step_size * m / (sqrt(v) / c2_sqrt + eps).
void AdamWStep(int64_t n, float decay, float beta1, float beta2,
               float step_size, float c2_sqrt, float eps, const float* g,
               float* w, float* m, float* v);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_OPTIMIZER_H_
