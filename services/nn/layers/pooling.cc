#include "services/nn/layers/pooling.h"

#include "services/tensor/cpu/pool.h"

namespace gpipe {

Tensor MaxPool2d::Forward(const Tensor& x, const LayerContext&, Saved* saved) {
  const int64_t batch = x.dim(0), c = input_[0], h = input_[1], w = input_[2];
  const int64_t oh = (h - kernel_) / stride_ + 1;
  const int64_t ow = (w - kernel_) / stride_ + 1;
  Tensor y = Tensor::Empty({batch, c, oh, ow});
  Tensor argmax = Tensor::Empty({batch, c, oh, ow}, DType::kI32);
  cpu::MaxPool2dForward(batch * c, h, w, kernel_, stride_, x.f32(), y.f32(),
                        argmax.i32());
  if (saved != nullptr) saved->tensors = {argmax};
  return y;
}

Tensor MaxPool2d::Backward(const Tensor& dy, const Saved& saved,
                           const LayerContext&) {
  const int64_t batch = dy.dim(0);
  Tensor dx = Tensor::Empty(input_.WithBatch(batch));
  cpu::MaxPool2dBackward(batch * input_[0], input_[1], input_[2], dy.dim(2),
                         dy.dim(3), dy.f32(), saved.tensors[0].i32(), dx.f32());
  return dx;
}

Tensor GlobalAvgPool::Forward(const Tensor& x, const LayerContext&, Saved*) {
  const int64_t batch = x.dim(0);
  Tensor y = Tensor::Empty({batch, input_[0]});
  cpu::GlobalAvgPoolForward(batch * input_[0], input_[1] * input_[2], x.f32(),
                            y.f32());
  return y;
}

Tensor GlobalAvgPool::Backward(const Tensor& dy, const Saved&,
                               const LayerContext&) {
  const int64_t batch = dy.dim(0);
  Tensor dx = Tensor::Empty(input_.WithBatch(batch));
  cpu::GlobalAvgPoolBackward(batch * input_[0], input_[1] * input_[2], dy.f32(),
                             dx.f32());
  return dx;
}

}  // namespace gpipe
