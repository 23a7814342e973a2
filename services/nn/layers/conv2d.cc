#include "services/nn/layers/conv2d.h"

#include <algorithm>
#include <cmath>

#include "services/nn/init.h"
#include "services/tensor/cpu/elementwise.h"
#include "services/tensor/cpu/gemm.h"
#include "services/tensor/cpu/reduce.h"

namespace gpipe {

Conv2d::Conv2d(const Shape& input, int64_t out_channels, int64_t kernel,
               int64_t stride, int64_t padding, bool bias)
    : geometry_{input[0], input[1], input[2], kernel, stride, padding},
      out_channels_(out_channels),
      has_bias_(bias),
      weight_(MakeParameter("weight", {out_channels, input[0], kernel, kernel},
                            true)) {
  if (has_bias_) bias_ = MakeParameter("bias", {out_channels}, false);
}

std::vector<Parameter*> Conv2d::Parameters() {
  if (has_bias_) return {&weight_, &bias_};
  return {&weight_};
}

void Conv2d::Initialize(uint64_t key) {
  const int64_t fan_in =
      geometry_.channels * geometry_.kernel * geometry_.kernel;
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  InitUniform(weight_.value, MixKey({key, 0}), bound);
  if (has_bias_) InitUniform(bias_.value, MixKey({key, 1}), bound);
}

int64_t Conv2d::ChunkSize(int64_t batch) const {
  const int64_t ckk = geometry_.channels * geometry_.kernel * geometry_.kernel;
  const int64_t hw = geometry_.out_height() * geometry_.out_width();
  const int64_t per_sample = ckk * hw;
  return std::clamp<int64_t>((2 << 20) / std::max<int64_t>(per_sample, 1), 1,
                             batch);
}

Tensor Conv2d::Forward(const Tensor& x, const LayerContext&, Saved* saved) {
  const cpu::ConvGeometry& g = geometry_;
  const int64_t batch = x.dim(0), hw = g.out_height() * g.out_width();
  const int64_t ckk = g.channels * g.kernel * g.kernel;
  const int64_t in_size = g.channels * g.height * g.width;
  const int64_t chunk = ChunkSize(batch);
  Tensor y =
      Tensor::Empty({batch, out_channels_, g.out_height(), g.out_width()});
  Tensor col = Tensor::Empty({ckk, chunk * hw});
  Tensor out = Tensor::Empty({out_channels_, chunk * hw});
  for (int64_t b0 = 0; b0 < batch; b0 += chunk) {
    const int64_t nb = std::min(chunk, batch - b0), ld = nb * hw;
#pragma omp parallel for if (nb > 1)
    for (int64_t i = 0; i < nb; ++i)
      cpu::Im2Col(g, x.f32() + (b0 + i) * in_size, col.f32() + i * hw, ld);
    cpu::Gemm(false, false, out_channels_, ld, ckk, 1.0f, weight_.value.f32(),
              col.f32(), 0.0f, out.f32());
    // [Cout, nb*HW] -> [nb, Cout, HW]
#pragma omp parallel for if (nb > 1)
    for (int64_t i = 0; i < nb; ++i)
      for (int64_t c = 0; c < out_channels_; ++c)
        std::copy_n(out.f32() + c * ld + i * hw, hw,
                    y.f32() + ((b0 + i) * out_channels_ + c) * hw);
  }
  if (has_bias_)
    cpu::AddChannelBias(batch, out_channels_, hw, bias_.value.f32(), y.f32());
  if (saved != nullptr) saved->tensors = {x};
  return y;
}

Tensor Conv2d::Backward(const Tensor& dy, const Saved& saved,
                        const LayerContext&) {
  const cpu::ConvGeometry& g = geometry_;
  const Tensor& x = saved.tensors[0];
  const int64_t batch = x.dim(0), hw = g.out_height() * g.out_width();
  const int64_t ckk = g.channels * g.kernel * g.kernel;
  const int64_t in_size = g.channels * g.height * g.width;
  const int64_t chunk = ChunkSize(batch);
  if (has_bias_)
    cpu::SumChannelsInto(batch, out_channels_, hw, dy.f32(), bias_.grad.f32());
  Tensor dx = Tensor::Zeros(x.shape());
  Tensor col = Tensor::Empty({ckk, chunk * hw});
  Tensor dcol = Tensor::Empty({ckk, chunk * hw});
  Tensor dout = Tensor::Empty({out_channels_, chunk * hw});
  for (int64_t b0 = 0; b0 < batch; b0 += chunk) {
    const int64_t nb = std::min(chunk, batch - b0), ld = nb * hw;
#pragma omp parallel for if (nb > 1)
    for (int64_t i = 0; i < nb; ++i) {
      cpu::Im2Col(g, x.f32() + (b0 + i) * in_size, col.f32() + i * hw, ld);
      for (int64_t c = 0; c < out_channels_; ++c)
        std::copy_n(dy.f32() + ((b0 + i) * out_channels_ + c) * hw, hw,
                    dout.f32() + c * ld + i * hw);
    }
    // dW += dY col^T; dcol = W^T dY.
    cpu::GemmStrided(false, true, out_channels_, ckk, ld, 1.0f, dout.f32(), ld,
                     col.f32(), ld, 1.0f, weight_.grad.f32(), ckk);
    cpu::GemmStrided(true, false, ckk, ld, out_channels_, 1.0f,
                     weight_.value.f32(), ckk, dout.f32(), ld, 0.0f, dcol.f32(),
                     ld);
#pragma omp parallel for if (nb > 1)
    for (int64_t i = 0; i < nb; ++i)
      cpu::Col2Im(g, dcol.f32() + i * hw, ld, dx.f32() + (b0 + i) * in_size);
  }
  return dx;
}

}  // namespace gpipe
