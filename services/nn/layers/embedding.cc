#include "services/nn/layers/embedding.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/nn/init.h"
#include "services/tensor/cpu/elementwise.h"
#include "services/tensor/cpu/embedding.h"
#include "services/tensor/ops.h"

namespace gpipe {

Embedding::Embedding(int64_t vocab_size, int64_t dim, int64_t max_positions)
    : vocab_(vocab_size),
      dim_(dim),
      max_positions_(max_positions),
      token_(MakeParameter("token_weight", {vocab_size, dim}, true)),
      position_(MakeParameter("position_weight", {max_positions, dim}, true)) {}

void Embedding::Initialize(uint64_t key) {
  InitNormal(token_.value, MixKey({key, 0}), 0.02f);
  InitNormal(position_.value, MixKey({key, 1}), 0.02f);
}

absl::Status Embedding::CheckInput(const Tensor& x) const {
  const Tensor host = x.device() == Device::kCpu ? x : x.To(Device::kCpu);
  int64_t outside = 0, first = 0;
  for (int64_t i = 0; i < host.numel(); ++i) {
    const int32_t id = host.i32()[i];
    if (id < 0 || id >= vocab_) {
      if (outside++ == 0) first = id;
    }
  }
  if (outside == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      outside, " token id(s) are outside the embedding's vocabulary of ",
      vocab_, " (the first: ", first,
      "): the data does not fit the model's vocab_size"));
}

Tensor Embedding::Forward(const Tensor& x, const LayerContext&, Saved* saved) {
  const int64_t batch = x.dim(0), t = x.dim(1);
  // Ids outside the vocabulary come from data, not from us: clamp them
  // rather than read out of bounds (validation reports bad data earlier).
  const Device d = x.device();
  Tensor ids = Tensor::Empty(x.shape(), DType::kI32, d);
  Tensor y = Tensor::Empty({batch, t, dim_}, DType::kF32, d);
  ops::EmbeddingForward(d, batch, t, dim_, vocab_, x.i32(), token_.value.f32(),
                        position_.value.f32(), y.f32(), ids.i32());
  if (saved != nullptr) saved->Put("ids", ids);
  return y;
}

Tensor Embedding::Decode(const Tensor& x, int64_t position, DecodeState*) {
  const int64_t batch = x.dim(0), t = x.dim(1);
  const Device d = token_.value.device();
  // A sequence longer than the table has no positions to add: callers
  // (the generator) keep within max_positions.
  const int64_t rows = std::clamp<int64_t>(max_positions_ - position, 0, t);
  if (rows == t) {
    // Forward's gather and adds, with the rows of positions from
    // `position` on.
    const Tensor ids = x.To(d);
    Tensor clamped = Tensor::Empty(x.shape(), DType::kI32, d);
    Tensor y = Tensor::Empty({batch, t, dim_}, DType::kF32, d);
    ops::EmbeddingForward(
        d, batch, t, dim_, vocab_, ids.i32(), token_.value.f32(),
        position_.value.f32() + position * dim_, y.f32(), clamped.i32());
    return y;
  }
  const Tensor ids = x.To(Device::kCpu);
  const Tensor token = token_.value.To(Device::kCpu);
  const Tensor positions = position_.value.To(Device::kCpu);
  std::vector<int32_t> clamped(static_cast<size_t>(ids.numel()));
  for (int64_t i = 0; i < ids.numel(); ++i)
    clamped[i] = std::clamp<int32_t>(ids.i32()[i], 0, vocab_ - 1);
  Tensor y = Tensor::Empty({batch, t, dim_}, DType::kF32);
  cpu::EmbeddingGather(batch * t, dim_, clamped.data(), token.f32(), y.f32());
  for (int64_t b = 0; b < batch; ++b) {
    cpu::AddInPlace(rows * dim_, positions.f32() + position * dim_,
                    y.f32() + b * t * dim_);
  }
  return y.To(d);
}

Tensor Embedding::Backward(const Tensor& dy, const Saved& saved,
                           const LayerContext&) {
  const Tensor& ids = saved.Get("ids");
  const int64_t batch = ids.dim(0), t = ids.dim(1);
  ops::EmbeddingBackward(ids.device(), batch, t, dim_, ids.i32(), dy.f32(),
                         token_.grad.f32(), position_.grad.f32());
  return Tensor();
}

// No input gradient: the whole backward is the weight half.
Tensor Embedding::BackwardInput(const Tensor& dy, Saved&, const LayerContext&,
                                Saved* deferred) {
  deferred->Put("dy", dy);
  return Tensor();
}

void Embedding::BackwardWeight(const Saved& saved, const Saved& deferred,
                               const LayerContext& ctx) {
  Backward(deferred.Get("dy"), saved, ctx);
}

}  // namespace gpipe
