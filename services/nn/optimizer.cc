#include "services/nn/optimizer.h"

#include <cmath>

#include "absl/status/status.h"
#include "services/tensor/device.h"
#include "services/tensor/ops.h"

namespace gpipe {
namespace {

// Optimizer state lives with its parameter, on its device.
Tensor ZerosLike(const Tensor& t) {
  AllocatorScope scope(DefaultAllocator(t.device()));
  return Tensor::Zeros(t.shape(), DType::kF32, t.device());
}

// PyTorch's SGD (decaying the parameters `weight_decay_on` names): g += wd * p;
// buf = mu * buf + g; p -= lr * (nesterov ? g + mu * buf : buf).
class Sgd final : public Optimizer {
 public:
  Sgd(const gpipe::v1::Sgd& spec, bool decay_all,
      std::vector<NamedParameter> params)
      : spec_(spec), decay_all_(decay_all), params_(std::move(params)) {
    if (spec_.momentum() > 0)
      for (const NamedParameter& p : params_)
        momentum_.push_back(ZerosLike(p.param->value));
  }

  void Step(float lr, int64_t step,
            const std::function<void(size_t)>& updated) override {
    const float mu = spec_.momentum(), wd = spec_.weight_decay();
    for (size_t i = 0; i < params_.size(); ++i) {
      Parameter& p = *params_[i].param;
      float* w = p.value.f32();
      const float* g = p.grad.f32();
      const int64_t n = p.value.numel();
      const float decay = p.decay || decay_all_ ? wd : 0.0f;
      ops::SgdStep(p.value.device(), n, lr, decay, mu, spec_.nesterov(),
                   step == 1, g, w, mu == 0.0f ? nullptr : momentum_[i].f32());
      if (updated) updated(i);
    }
  }

  std::vector<NamedTensor> State() override {
    std::vector<NamedTensor> out;
    for (size_t i = 0; i < momentum_.size(); ++i)
      out.push_back({params_[i].name + ".momentum", &momentum_[i]});
    return out;
  }

 private:
  gpipe::v1::Sgd spec_;
  bool decay_all_;
  std::vector<NamedParameter> params_;
  std::vector<Tensor> momentum_;
};

// PyTorch's AdamW: p *= 1 - lr*wd; m, v moments with bias correction.
class AdamW final : public Optimizer {
 public:
  AdamW(const gpipe::v1::AdamW& spec, bool decay_all,
        std::vector<NamedParameter> params)
      : params_(std::move(params)),
        decay_all_(decay_all),
        beta1_(spec.has_beta1() ? spec.beta1() : 0.9f),
        beta2_(spec.has_beta2() ? spec.beta2() : 0.999f),
        eps_(spec.has_eps() ? spec.eps() : 1e-8f),
        wd_(spec.has_weight_decay() ? spec.weight_decay() : 0.01f) {
    for (const NamedParameter& p : params_) {
      m_.push_back(ZerosLike(p.param->value));
      v_.push_back(ZerosLike(p.param->value));
    }
  }

  void Step(float lr, int64_t step,
            const std::function<void(size_t)>& updated) override {
    const double c1 = 1.0 - std::pow(static_cast<double>(beta1_), step);
    const double c2 = 1.0 - std::pow(static_cast<double>(beta2_), step);
    const float step_size = static_cast<float>(lr / c1);
    const float c2_sqrt = static_cast<float>(std::sqrt(c2));
    for (size_t i = 0; i < params_.size(); ++i) {
      Parameter& p = *params_[i].param;
      float* w = p.value.f32();
      const float* g = p.grad.f32();
      float* m = m_[i].f32();
      float* v = v_[i].f32();
      const int64_t n = p.value.numel();
      const float decay = p.decay || decay_all_ ? 1.0f - lr * wd_ : 1.0f;
      ops::AdamWStep(p.value.device(), n, decay, beta1_, beta2_, step_size,
                     c2_sqrt, eps_, g, w, m, v);
      if (updated) updated(i);
    }
  }

  std::vector<NamedTensor> State() override {
    std::vector<NamedTensor> out;
    for (size_t i = 0; i < params_.size(); ++i) {
      out.push_back({params_[i].name + ".exp_avg", &m_[i]});
      out.push_back({params_[i].name + ".exp_avg_sq", &v_[i]});
    }
    return out;
  }

 private:
  std::vector<NamedParameter> params_;
  bool decay_all_;
  float beta1_, beta2_, eps_, wd_;
  std::vector<Tensor> m_, v_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(
    const gpipe::v1::OptimizerSpec& spec, std::vector<NamedParameter> params) {
  const bool decay_all =
      spec.weight_decay_on() == gpipe::v1::WEIGHT_DECAY_ON_ALL;
  switch (spec.kind_case()) {
    case gpipe::v1::OptimizerSpec::kSgd:
      return std::make_unique<Sgd>(spec.sgd(), decay_all, std::move(params));
    case gpipe::v1::OptimizerSpec::kAdamw:
      return std::make_unique<AdamW>(spec.adamw(), decay_all,
                                     std::move(params));
    case gpipe::v1::OptimizerSpec::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("optimizer: no optimizer kind set");
}

float LearningRate(const gpipe::v1::OptimizerSpec& spec, int64_t step,
                   int64_t total_steps) {
  const double lr = spec.lr(), min_lr = spec.min_lr();
  const int64_t warmup = spec.warmup_steps();
  if (step < warmup) return static_cast<float>(lr * (step + 1) / warmup);
  const int64_t span = total_steps - warmup;
  const double t =
      span > 1 ? static_cast<double>(step - warmup) / (span - 1) : 1.0;
  switch (spec.decay()) {
    case gpipe::v1::LR_DECAY_COSINE:
      return static_cast<float>(min_lr + (lr - min_lr) * 0.5 *
                                             (1.0 + std::cos(M_PI * t)));
    case gpipe::v1::LR_DECAY_LINEAR:
      return static_cast<float>(lr + (min_lr - lr) * t);
    default:
      return static_cast<float>(lr);
  }
}

std::vector<double> GradSquaresByParameter(
    const std::vector<NamedParameter>& params) {
  std::vector<double> out;
  out.reserve(params.size());
  for (const NamedParameter& p : params)
    out.push_back(ops::SumSquares(p.param->grad.device(), p.param->grad.numel(),
                                  p.param->grad.f32()));
  return out;
}

double FoldGradSquares(const std::vector<double>& by_parameter,
                       double running) {
  for (double s : by_parameter) running += s;
  return running;
}

double AccumulateGradSquares(const std::vector<NamedParameter>& params,
                             double running) {
  return FoldGradSquares(GradSquaresByParameter(params), running);
}

bool ClipsGradients(const gpipe::v1::OptimizerSpec& spec) {
  return spec.clip_norm() > 0.0f;
}

float ClipCoefficient(double grad_squares, float clip_norm) {
  if (clip_norm <= 0.0f) return 1.0f;
  const double norm = std::sqrt(grad_squares);
  if (!(norm > clip_norm)) return 1.0f;
  return static_cast<float>(clip_norm / (norm + 1e-6));
}

void ScaleGradients(const std::vector<NamedParameter>& params, float factor) {
  if (factor == 1.0f) return;
  for (const NamedParameter& p : params)
    ops::Scale(p.param->grad.device(), p.param->grad.numel(), factor,
               p.param->grad.f32());
}

}  // namespace gpipe
