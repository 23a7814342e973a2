#include "services/nn/layers/pooling.h"

#include "services/tensor/ops.h"

namespace gpipe {

Tensor MaxPool2d::Forward(const Tensor& x, const LayerContext&, Saved* saved) {
  const int64_t batch = x.dim(0), c = input_[0], h = input_[1], w = input_[2];
  const int64_t oh = (h - kernel_) / stride_ + 1;
  const int64_t ow = (w - kernel_) / stride_ + 1;
  const Device d = x.device();
  Tensor y = Tensor::Empty({batch, c, oh, ow}, DType::kF32, d);
  Tensor argmax = Tensor::Empty({batch, c, oh, ow}, DType::kI32, d);
  ops::MaxPool2dForward(d, batch * c, h, w, kernel_, stride_, x.f32(), y.f32(),
                        argmax.i32());
  if (saved != nullptr) saved->Put("argmax", argmax);
  return y;
}

Tensor MaxPool2d::Backward(const Tensor& dy, const Saved& saved,
                           const LayerContext&) {
  const int64_t batch = dy.dim(0);
  const Device d = dy.device();
  Tensor dx = Tensor::Empty(input_.WithBatch(batch), DType::kF32, d);
  ops::MaxPool2dBackward(d, batch * input_[0], input_[1], input_[2], kernel_,
                         stride_, dy.f32(), saved.Get("argmax").i32(),
                         dx.f32());
  return dx;
}

Tensor GlobalAvgPool::Forward(const Tensor& x, const LayerContext&, Saved*) {
  const int64_t batch = x.dim(0);
  const Device d = x.device();
  Tensor y = Tensor::Empty({batch, input_[0]}, DType::kF32, d);
  ops::GlobalAvgPoolForward(d, batch * input_[0], input_[1] * input_[2],
                            x.f32(), y.f32());
  return y;
}

Tensor GlobalAvgPool::Backward(const Tensor& dy, const Saved&,
                               const LayerContext&) {
  const int64_t batch = dy.dim(0);
  const Device d = dy.device();
  Tensor dx = Tensor::Empty(input_.WithBatch(batch), DType::kF32, d);
  ops::GlobalAvgPoolBackward(d, batch * input_[0], input_[1] * input_[2],
                             dy.f32(), dx.f32());
  return dx;
}

}  // namespace gpipe
