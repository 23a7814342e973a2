#include "services/nn/layers/batch_norm.h"

#include <cmath>

#include "services/nn/init.h"

namespace gpipe {

BatchNorm::BatchNorm(const Shape& input, float momentum, float eps)
    : channels_(input[0]),
      inner_(input.rank() == 3 ? input[1] * input[2] : 1),
      momentum_(momentum),
      eps_(eps),
      weight_(MakeParameter("weight", {input[0]}, false)),
      bias_(MakeParameter("bias", {input[0]}, false)) {
  AllocatorScope scope(DefaultCpuAllocator());
  running_mean_ = Tensor::Zeros({channels_});
  running_var_ = Tensor::Filled({channels_}, 1.0f);
}

std::vector<NamedBuffer> BatchNorm::Buffers() {
  return {{"running_mean", &running_mean_}, {"running_var", &running_var_}};
}

void BatchNorm::Initialize(uint64_t) {
  for (int64_t c = 0; c < channels_; ++c) {
    weight_.value.f32()[c] = 1.0f;
    running_mean_.f32()[c] = 0.0f;
    running_var_.f32()[c] = 1.0f;
  }
  bias_.value.SetZero();
}

// Channel statistics are summed in double, channel by channel, so they do
// not depend on threads; the normalized input is saved for backward.
Tensor BatchNorm::Forward(const Tensor& x, const LayerContext& ctx,
                          Saved* saved) {
  const int64_t batch = x.dim(0), n = batch * inner_;
  Tensor y = Tensor::Empty(x.shape());
  Tensor xhat = saved != nullptr ? Tensor::Empty(x.shape()) : Tensor();
  Tensor rstd = Tensor::Empty({channels_});
  const bool batch_stats = ctx.training;
#pragma omp parallel for if (x.numel() > (1 << 15))
  for (int64_t c = 0; c < channels_; ++c) {
    float mean, var;
    if (batch_stats) {
      double s = 0.0, ss = 0.0;
      for (int64_t b = 0; b < batch; ++b) {
        const float* p = x.f32() + (b * channels_ + c) * inner_;
        for (int64_t i = 0; i < inner_; ++i) s += p[i];
      }
      mean = static_cast<float>(s / n);
      for (int64_t b = 0; b < batch; ++b) {
        const float* p = x.f32() + (b * channels_ + c) * inner_;
        for (int64_t i = 0; i < inner_; ++i) {
          const double d = p[i] - mean;
          ss += d * d;
        }
      }
      var = static_cast<float>(ss / n);
      if (!ctx.recompute) {
        const float unbiased = n > 1 ? static_cast<float>(ss / (n - 1)) : var;
        float& rm = running_mean_.f32()[c];
        float& rv = running_var_.f32()[c];
        rm = (1.0f - momentum_) * rm + momentum_ * mean;
        rv = (1.0f - momentum_) * rv + momentum_ * unbiased;
      }
    } else {
      mean = running_mean_.f32()[c];
      var = running_var_.f32()[c];
    }
    const float r = 1.0f / std::sqrt(var + eps_);
    rstd.f32()[c] = r;
    const float gamma = weight_.value.f32()[c], beta = bias_.value.f32()[c];
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t off = (b * channels_ + c) * inner_;
      for (int64_t i = 0; i < inner_; ++i) {
        const float h = (x.f32()[off + i] - mean) * r;
        if (xhat.defined()) xhat.f32()[off + i] = h;
        y.f32()[off + i] = h * gamma + beta;
      }
    }
  }
  if (saved != nullptr) saved->tensors = {xhat, rstd};
  return y;
}

Tensor BatchNorm::Backward(const Tensor& dy, const Saved& saved,
                           const LayerContext&) {
  const Tensor& xhat = saved.tensors[0];
  const Tensor& rstd = saved.tensors[1];
  const int64_t batch = dy.dim(0), n = batch * inner_;
  Tensor dx = Tensor::Empty(dy.shape());
#pragma omp parallel for if (dy.numel() > (1 << 15))
  for (int64_t c = 0; c < channels_; ++c) {
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t off = (b * channels_ + c) * inner_;
      for (int64_t i = 0; i < inner_; ++i) {
        sum_dy += dy.f32()[off + i];
        sum_dy_xhat +=
            static_cast<double>(dy.f32()[off + i]) * xhat.f32()[off + i];
      }
    }
    weight_.grad.f32()[c] += static_cast<float>(sum_dy_xhat);
    bias_.grad.f32()[c] += static_cast<float>(sum_dy);
    const float k = weight_.value.f32()[c] * rstd.f32()[c] / n;
    const float mean_dy = static_cast<float>(sum_dy);
    const float mean_dyx = static_cast<float>(sum_dy_xhat);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t off = (b * channels_ + c) * inner_;
      for (int64_t i = 0; i < inner_; ++i)
        dx.f32()[off + i] = k * (n * dy.f32()[off + i] - mean_dy -
                                 xhat.f32()[off + i] * mean_dyx);
    }
  }
  return dx;
}

}  // namespace gpipe
