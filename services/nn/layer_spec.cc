#include "services/nn/layer_spec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/tensor/cpu/gemm.h"

namespace gpipe {
namespace {

namespace v1 = ::gpipe::v1;

template <typename... Args>
absl::Status FieldError(std::string_view path, const Args&... args) {
  return absl::InvalidArgumentError(
      absl::StrCat(AsAbsl(path), ": ", AsAbsl(args)...));
}

// A size field: positive, and small enough that products of a few of them
// stay exact in int64.
absl::Status CheckPositive(std::string_view path, int64_t v) {
  if (v <= 0) return FieldError(path, "must be positive, got ", v);
  if (v > kMaxSpecSize) {
    return FieldError(path, v, " is too large (at most ", kMaxSpecSize, ")");
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegative(std::string_view path, int64_t v) {
  if (v < 0) return FieldError(path, "must be >= 0, got ", v);
  if (v > kMaxSpecSize) {
    return FieldError(path, v, " is too large (at most ", kMaxSpecSize, ")");
  }
  return absl::OkStatus();
}

// [0, 1); written so that NaN fails.
absl::Status CheckProbability(std::string_view path, float p) {
  if (!(p >= 0 && p < 1)) return FieldError(path, "must be in [0, 1), got ", p);
  return absl::OkStatus();
}

absl::Status CheckEps(std::string_view path, float eps) {
  if (!(eps > 0) || !std::isfinite(eps)) {
    return FieldError(path, "must be positive, got ", eps);
  }
  return absl::OkStatus();
}

// A size that must agree with the incoming shape. `what` qualifies the
// dimension (" channels") where the bare number would be ambiguous.
absl::Status CheckMatches(std::string_view path, int64_t value,
                          int64_t expected, std::string_view what = "") {
  if (value != expected) {
    return FieldError(path, value,
                      " does not match the previous layer's output", what, " ",
                      expected);
  }
  return absl::OkStatus();
}

absl::Status CheckRank(std::string_view path, const Shape& in, int rank,
                       std::string_view layout) {
  if (in.rank() != rank) {
    return FieldError(path, "needs an input of ", layout, ", got ",
                      in.ToString());
  }
  return absl::OkStatus();
}

// numel() without the overflow: false when the product exceeds `limit`.
bool NumelWithin(const Shape& s, int64_t limit) {
  int64_t n = 1;
  for (int64_t d : s.dims()) {
    if (d < 0 || (d > 0 && n > limit / d)) return false;
    n *= d;
  }
  return n <= limit;
}

absl::StatusOr<Shape> InferLinear(const v1::Linear& l, const Shape& in,
                                  const std::string& p) {
  if (in.rank() < 1) return FieldError(p, "needs an input of rank >= 1");
  RETURN_IF_ERROR(CheckPositive(p + ".in_features", l.in_features()));
  RETURN_IF_ERROR(CheckMatches(p + ".in_features", l.in_features(), in.back()));
  RETURN_IF_ERROR(CheckPositive(p + ".out_features", l.out_features()));
  Shape out = in;
  out[out.rank() - 1] = l.out_features();
  return out;
}

absl::StatusOr<Shape> InferLayerNorm(const v1::LayerNorm& l, const Shape& in,
                                     const std::string& p) {
  if (in.rank() < 1) return FieldError(p, "needs an input of rank >= 1");
  // No inference from 0: the spec should say what it normalizes so that a
  // change upstream cannot silently resize this layer.
  RETURN_IF_ERROR(CheckMatches(p + ".features", l.features(), in.back()));
  if (l.has_eps()) RETURN_IF_ERROR(CheckEps(p + ".eps", l.eps()));
  return in;
}

absl::StatusOr<Shape> InferEmbedding(const v1::Embedding& e, const Shape& in,
                                     const std::string& p) {
  RETURN_IF_ERROR(CheckRank(p, in, 1, "[T] token ids"));
  RETURN_IF_ERROR(CheckPositive(p + ".vocab_size", e.vocab_size()));
  RETURN_IF_ERROR(CheckPositive(p + ".dim", e.dim()));
  RETURN_IF_ERROR(CheckPositive(p + ".max_positions", e.max_positions()));
  if (e.max_positions() < in[0]) {
    return FieldError(p + ".max_positions", e.max_positions(),
                      " is smaller than the sequence length ", in[0]);
  }
  return Shape{in[0], e.dim()};
}

// What SelfAttention and TransformerBlock share: [T, dim] in and out.
absl::StatusOr<Shape> InferAttention(int64_t dim, int64_t heads,
                                     const Shape& in, const std::string& p) {
  RETURN_IF_ERROR(CheckRank(p, in, 2, "[T, dim]"));
  RETURN_IF_ERROR(CheckPositive(p + ".dim", dim));
  RETURN_IF_ERROR(CheckMatches(p + ".dim", dim, in.back()));
  RETURN_IF_ERROR(CheckPositive(p + ".heads", heads));
  if (dim % heads != 0) {
    return FieldError(p + ".heads", "dim ", dim, " is not divisible by ", heads,
                      " heads");
  }
  return in;
}

absl::StatusOr<Shape> InferTransformerBlock(const v1::TransformerBlock& b,
                                            const Shape& in,
                                            const std::string& p) {
  ASSIGN_OR_RETURN(Shape out, InferAttention(b.dim(), b.heads(), in, p));
  RETURN_IF_ERROR(CheckNonNegative(p + ".mlp_hidden", b.mlp_hidden()));
  RETURN_IF_ERROR(CheckProbability(p + ".dropout", b.dropout()));
  return out;
}

// Output size of a window sliding over `size` (already padded).
int64_t WindowOutput(int64_t size, int64_t kernel, int64_t stride) {
  return (size - kernel) / stride + 1;
}

absl::StatusOr<Shape> InferConv2d(const v1::Conv2d& c, const Shape& in,
                                  const std::string& p) {
  RETURN_IF_ERROR(CheckRank(p, in, 3, "[C, H, W]"));
  RETURN_IF_ERROR(CheckPositive(p + ".in_channels", c.in_channels()));
  RETURN_IF_ERROR(
      CheckMatches(p + ".in_channels", c.in_channels(), in[0], " channels"));
  RETURN_IF_ERROR(CheckPositive(p + ".out_channels", c.out_channels()));
  RETURN_IF_ERROR(CheckPositive(p + ".kernel_size", c.kernel_size()));
  if (c.has_stride()) RETURN_IF_ERROR(CheckPositive(p + ".stride", c.stride()));
  RETURN_IF_ERROR(CheckNonNegative(p + ".padding", c.padding()));
  const int64_t k = c.kernel_size();
  const int64_t s = c.has_stride() ? c.stride() : 1;
  const int64_t h = in[1] + 2 * c.padding();
  const int64_t w = in[2] + 2 * c.padding();
  if (h < k || w < k) {
    return FieldError(p + ".kernel_size", k,
                      " is larger than the padded input ", h, "x", w);
  }
  return Shape{c.out_channels(), WindowOutput(h, k, s), WindowOutput(w, k, s)};
}

absl::StatusOr<Shape> InferMaxPool2d(const v1::MaxPool2d& m, const Shape& in,
                                     const std::string& p) {
  RETURN_IF_ERROR(CheckRank(p, in, 3, "[C, H, W]"));
  RETURN_IF_ERROR(CheckPositive(p + ".kernel_size", m.kernel_size()));
  if (m.has_stride()) RETURN_IF_ERROR(CheckPositive(p + ".stride", m.stride()));
  const int64_t k = m.kernel_size();
  const int64_t s = m.has_stride() ? m.stride() : k;
  if (in[1] < k || in[2] < k) {
    return FieldError(p + ".kernel_size", k, " is larger than the input ",
                      in[1], "x", in[2]);
  }
  return Shape{in[0], WindowOutput(in[1], k, s), WindowOutput(in[2], k, s)};
}

absl::StatusOr<Shape> InferBatchNorm(const v1::BatchNorm& b, const Shape& in,
                                     const std::string& p) {
  if (in.rank() != 3 && in.rank() != 1) {
    return FieldError(p, "needs an input of [C, H, W] or [F], got ",
                      in.ToString());
  }
  const int64_t features = in.rank() == 3 ? in[0] : in.back();
  RETURN_IF_ERROR(CheckMatches(p + ".features", b.features(), features,
                               in.rank() == 3 ? " channels" : ""));
  if (b.has_momentum() && !(b.momentum() >= 0 && b.momentum() <= 1)) {
    return FieldError(p + ".momentum", "must be in [0, 1], got ", b.momentum());
  }
  if (b.has_eps()) RETURN_IF_ERROR(CheckEps(p + ".eps", b.eps()));
  return in;
}

absl::StatusOr<Shape> InferKind(const v1::LayerSpec& spec, const Shape& in,
                                const std::string& p) {
  using K = v1::LayerSpec;
  switch (spec.kind_case()) {
    case K::kLinear:
      return InferLinear(spec.linear(), in, p);
    case K::kRelu:
    case K::kGelu:
    case K::kTanh:
      return in;
    case K::kDropout:
      RETURN_IF_ERROR(CheckProbability(p + ".p", spec.dropout().p()));
      return in;
    case K::kLayerNorm:
      return InferLayerNorm(spec.layer_norm(), in, p);
    case K::kEmbedding:
      return InferEmbedding(spec.embedding(), in, p);
    case K::kSelfAttention:
      return InferAttention(spec.self_attention().dim(),
                            spec.self_attention().heads(), in, p);
    case K::kTransformerBlock:
      return InferTransformerBlock(spec.transformer_block(), in, p);
    case K::kConv2D:
      return InferConv2d(spec.conv2d(), in, p);
    case K::kMaxPool2D:
      return InferMaxPool2d(spec.max_pool2d(), in, p);
    case K::kGlobalAvgPool:
      RETURN_IF_ERROR(CheckRank(p, in, 3, "[C, H, W]"));
      return Shape{in[0]};
    case K::kFlatten:
      if (in.rank() < 1) return FieldError(p, "needs an input of rank >= 1");
      return Shape{in.numel()};
    case K::kBatchNorm:
      return InferBatchNorm(spec.batch_norm(), in, p);
    case K::KIND_NOT_SET:
      break;
  }
  return FieldError(p, "no layer kind set");
}

// FLOPs of multi-head attention with its projections over [T, dim]. The
// score and value products are T*T*dim MACs each whatever the head count;
// causal masking is not subtracted: the GPU computes full scores, and the
// CPU (GemmTriangular) skips only the register tiles wholly masked, about
// half at T of a few hundred. The measured plan (`plan --measure`) sees
// what each device does.
// The q/k/v and output projections' products of one sample (`t` rows).
double AttentionProjectionFlops(double t, double dim) {
  return 2 * t * dim * 3 * dim + 2 * t * dim * dim;
}

double AttentionFlops(double t, double dim, double heads) {
  const double qkv = 2 * t * dim * 3 * dim;
  const double scores = 2 * t * t * dim;
  const double values = 2 * t * t * dim;
  const double softmax = 3 * heads * t * t;
  const double proj = 2 * t * dim * dim;
  return qkv + scores + values + softmax + proj;
}

// Q, K, V and output projections, each with a bias.
double AttentionParams(double dim) { return 4 * dim * dim + 4 * dim; }

// A Linear's weight packed for its forward (op(B) = W^T, in x out) and its
// input gradient (op(B) = W, out x in): services/nn/layers/linear.cc.
int64_t LinearPackedBytes(int64_t in, int64_t out) {
  return cpu::PackedBBytesBound(in, out) + cpu::PackedBBytesBound(out, in);
}
// Attention's q/k/v (dim -> 3 dim) and output (dim -> dim) projections.
int64_t AttentionPackedBytes(int64_t dim) {
  return LinearPackedBytes(dim, 3 * dim) + LinearPackedBytes(dim, dim);
}

// Parameter bytes as int64, saturating for absurd sizes rather than wrapping.
int64_t ParamBytes(double params) {
  const double bytes = 4 * params;
  constexpr double kMax =
      static_cast<double>(std::numeric_limits<int64_t>::max());
  return bytes >= kMax ? std::numeric_limits<int64_t>::max()
                       : static_cast<int64_t>(bytes);
}

}  // namespace

std::string_view LayerKindName(const v1::LayerSpec& spec) {
  const google::protobuf::FieldDescriptor* field =
      v1::LayerSpec::descriptor()->FindFieldByNumber(spec.kind_case());
  return field == nullptr ? std::string_view()
                          : std::string_view(field->name());
}

absl::StatusOr<Shape> InferOutputShape(const v1::LayerSpec& spec,
                                       const Shape& input, DType input_dtype,
                                       std::string_view path) {
  if (spec.kind_case() == v1::LayerSpec::KIND_NOT_SET) {
    return FieldError(path, "no layer kind set");
  }
  const std::string p =
      absl::StrCat(AsAbsl(path), ".", AsAbsl(LayerKindName(spec)));
  if (spec.has_embedding() && input_dtype != DType::kI32) {
    return FieldError(p, "needs int32 token ids as input, got ",
                      DTypeName(input_dtype));
  }
  if (!spec.has_embedding() && input_dtype != DType::kF32) {
    return FieldError(p, "needs a float32 input, got ", DTypeName(input_dtype),
                      " (only embedding takes token ids)");
  }
  ASSIGN_OR_RETURN(Shape out, InferKind(spec, input, p));
  if (!NumelWithin(out, kMaxSampleElements)) {
    return FieldError(p, "output ", out.ToString(), " has more than ",
                      kMaxSampleElements, " elements per sample");
  }
  return out;
}

LayerCost EstimateCost(const v1::LayerSpec& spec, const Shape& input,
                       const Shape& output) {
  using K = v1::LayerSpec;
  const double n_in = static_cast<double>(input.numel());
  const double n_out = static_cast<double>(output.numel());
  double flops = 0;
  double params = 0;
  // Memory, in floats (or int32s) per sample unless said otherwise.
  LayerCost cost;
  double saved = 0, workspace = 0, deferred = 0, forward_temp = 0,
         weight_saved = 0;
  switch (spec.kind_case()) {
    case K::kLinear: {
      cost.keeps_input = true;
      const v1::Linear& l = spec.linear();
      const double in = l.in_features(), out = l.out_features();
      const double rows = n_in / in;
      const bool bias = !l.has_bias() || l.bias();
      flops = 2 * rows * in * out + (bias ? rows * out : 0);
      cost.weight_flops = flops;
      params = in * out + (bias ? out : 0);
      cost.packed_weight_bytes =
          LinearPackedBytes(l.in_features(), l.out_features());
      deferred = n_out;
      cost.weight_keeps_input = true;
      cost.defers_output_grad = true;
      cost.weight_group_rows = static_cast<int64_t>(rows);
      cost.weight_group_held_bytes = ParamBytes(n_in + n_out);
      break;
    }
    case K::kRelu:
    case K::kTanh:
      flops = n_out;
      cost.keeps_output = true;  // the gradient needs only the output
      break;
    case K::kGelu:
      flops = n_out;
      cost.keeps_input = true;
      break;
    case K::kDropout:
      flops = n_out;
      // The mask is recomputed from its key in the backward; p = 0 passes
      // the input through.
      cost.output_is_input = spec.dropout().p() == 0.0f;
      cost.evaluation_passes_input = true;
      break;
    case K::kLayerNorm:
      flops = 5 * n_out;  // mean, variance, normalize, scale, shift
      params = 2.0 * spec.layer_norm().features();
      cost.keeps_input = true;
      saved = 2 * n_in / spec.layer_norm().features();  // mean, rstd per row
      forward_temp = saved;
      break;
    case K::kEmbedding: {
      const v1::Embedding& e = spec.embedding();
      flops = n_out;  // the position embedding add; the lookup is a copy
      cost.weight_flops = n_out;  // the scatter into the tables
      params =
          static_cast<double>(e.vocab_size() + e.max_positions()) * e.dim();
      saved = n_in;         // a checked copy of the ids (int32)
      forward_temp = n_in;  // made in any forward
      deferred = n_out;
      weight_saved = saved;
      cost.defers_output_grad = true;
      break;
    }
    case K::kSelfAttention: {
      const v1::SelfAttention& a = spec.self_attention();
      const double t = input[0], dim = a.dim();
      flops = AttentionFlops(t, dim, a.heads());
      cost.weight_flops = AttentionProjectionFlops(t, dim);
      params = AttentionParams(dim);
      cost.packed_weight_bytes = AttentionPackedBytes(a.dim());
      cost.keeps_input = true;  // by the q/k/v projection
      // q/k/v, the attention probabilities and the heads' output (the
      // output projection's input).
      saved = 3 * t * dim + a.heads() * t * t + t * dim;
      // The backward's output projection gradient and q/k/v's, beside its
      // input gradient (the probabilities' gradients are one (sample,
      // head) at a time, outside the tensors).
      workspace = 4 * t * dim;
      deferred = 3 * t * dim + t * dim;  // the two projections' outputs'
      cost.defers_output_grad = true;    // the output projection's
      // The projections' inputs: the layer's, and the heads' output.
      cost.weight_keeps_input = true;
      weight_saved = t * dim;
      // q/k/v, the probabilities and the heads' output, at once.
      forward_temp = 3 * t * dim + a.heads() * t * t + t * dim;
      break;
    }
    case K::kTransformerBlock: {
      const v1::TransformerBlock& b = spec.transformer_block();
      const double t = input[0], dim = b.dim();
      const double hidden = b.mlp_hidden() > 0 ? b.mlp_hidden() : 4 * dim;
      const double norms = 2 * 5 * t * dim;
      const double mlp = 2 * t * dim * hidden * 2 + t * hidden + t * hidden;
      const double residuals = 2 * t * dim;
      flops = AttentionFlops(t, dim, b.heads()) + norms + mlp + residuals;
      cost.weight_flops =
          AttentionProjectionFlops(t, dim) + 2 * t * dim * hidden * 2;
      params = AttentionParams(dim) + 2 * (2 * dim) +
               (dim * hidden + hidden + hidden * dim + dim);
      const int64_t h = static_cast<int64_t>(hidden);
      cost.packed_weight_bytes = AttentionPackedBytes(b.dim()) +
                                 LinearPackedBytes(b.dim(), h) +
                                 LinearPackedBytes(h, b.dim());
      cost.keeps_input = true;  // by the first layer norm
      // Both norms' outputs and statistics, q/k/v, the probabilities, the
      // heads' output, the residual sum between attention and MLP, the
      // hidden layer before and after GELU.
      saved = 2 * t * dim + 4 * t + 3 * t * dim + b.heads() * t * t + t * dim +
              t * dim + 2 * t * hidden;
      // The backward holds the MLP's hidden gradient (twice across GELU),
      // then the residual's gradient beside attention's own backward (its
      // workspace and input gradient); each dropout's gradient is a tensor
      // of its own. Less the block's input gradient, counted by the caller.
      const double dropout = b.dropout() > 0 ? t * dim : 0;
      workspace = std::max(dropout + 2 * t * hidden,
                           2 * dropout + t * hidden + 6 * t * dim) -
                  t * dim;
      // Gradients of the q/k/v, output and two MLP projections' outputs.
      deferred = 3 * t * dim + t * dim + t * hidden + t * dim;
      // The MLP's output projection's, unless a dropout comes between.
      cost.defers_output_grad = b.dropout() == 0;
      // The four GEMMs' inputs: both norms' outputs, the heads' output and
      // GELU's output.
      weight_saved = 3 * t * dim + t * hidden;
      // Inside attention: the first norm's output and statistics, q/k/v,
      // the probabilities and the heads' output; later the residual sum,
      // the hidden layer before and after GELU and the MLP's output (the
      // larger of the two).
      forward_temp =
          std::max(t * dim + 2 * t + 3 * t * dim + b.heads() * t * t + t * dim,
                   t * dim + 2 * t * hidden + t * dim);
      break;
    }
    case K::kConv2D: {
      const v1::Conv2d& c = spec.conv2d();
      const double k2 = static_cast<double>(c.kernel_size()) * c.kernel_size();
      const bool bias = !c.has_bias() || c.bias();
      flops = 2 * n_out * c.in_channels() * k2 + (bias ? n_out : 0);
      cost.weight_flops = flops;
      params = static_cast<double>(c.out_channels()) * c.in_channels() * k2 +
               (bias ? c.out_channels() : 0);
      cost.keeps_input = true;
      // A convolution makes its columns (the forward's, the weight
      // gradient's) and the columns' gradient (the input gradient's) one
      // sample at a time, one after the other (conv_ops.cc), and reads and
      // writes the layer's tensors in place. That is a stage's one compute
      // thread; on T threads the forward and the input gradient hold T
      // samples' columns at once, which this leaves out.
      const double positions = n_out / c.out_channels();
      const double columns = c.in_channels() * k2 * positions;
      workspace = columns;
      cost.workspace_samples = 1;
      forward_temp = columns;
      cost.splits_workspace = true;
      cost.input_workspace_bytes = ParamBytes(columns);
      cost.weight_workspace_bytes = cost.input_workspace_bytes;
      deferred = n_out;
      cost.weight_keeps_input = true;
      cost.defers_output_grad = true;
      break;
    }
    case K::kMaxPool2D: {
      const double k = spec.max_pool2d().kernel_size();
      flops = n_out * k * k;
      saved = n_out;  // the argmax of each output (int32)
      forward_temp = n_out;
      break;
    }
    case K::kGlobalAvgPool:
      flops = n_in;
      break;
    case K::kFlatten:
      cost.output_is_input = true;
      break;
    case K::kBatchNorm:
      flops = 5 * n_out;
      params = 2.0 * spec.batch_norm().features();
      cost.keeps_input = true;  // normalized again by the backward
      // The mean and rstd.
      cost.saved_fixed_bytes = 2 * 4 * spec.batch_norm().features();
      cost.buffer_bytes = 2 * 4 * spec.batch_norm().features();
      break;
    case K::KIND_NOT_SET:
      break;
  }
  cost.forward_flops = flops;
  cost.param_bytes = ParamBytes(params);
  cost.activation_bytes = output.numel() * 4;
  cost.saved_bytes = ParamBytes(saved);
  cost.workspace_bytes = ParamBytes(workspace);
  cost.deferred_bytes = ParamBytes(deferred);
  cost.forward_temp_bytes = ParamBytes(forward_temp);
  cost.weight_saved_bytes = ParamBytes(weight_saved);
  return cost;
}

absl::Status CheckModelInput(const v1::ModelSpec& model) {
  if (!model.has_input()) {
    return FieldError("model.input",
                      "must be set (dtype and shape of a sample)");
  }
  if (model.input().dtype() != v1::FLOAT32 &&
      model.input().dtype() != v1::INT32) {
    return FieldError("model.input.dtype", "must be FLOAT32 or INT32, got ",
                      static_cast<int>(model.input().dtype()));
  }
  const auto& dims = model.input().shape().dims();
  if (dims.empty()) {
    return FieldError("model.input.shape.dims", "needs at least one dimension");
  }
  for (int i = 0; i < dims.size(); ++i) {
    RETURN_IF_ERROR(CheckPositive(
        absl::StrCat("model.input.shape.dims[", i, "]"), dims[i]));
  }
  Shape shape(std::vector<int64_t>(dims.begin(), dims.end()));
  if (!NumelWithin(shape, kMaxSampleElements)) {
    return FieldError("model.input.shape", shape.ToString(), " has more than ",
                      kMaxSampleElements, " elements");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelShapes> InferModelShapes(const v1::ModelSpec& model) {
  RETURN_IF_ERROR(CheckModelInput(model));
  DType dtype = model.input().dtype() == v1::INT32 ? DType::kI32 : DType::kF32;
  const auto& dims = model.input().shape().dims();
  Shape shape(std::vector<int64_t>(dims.begin(), dims.end()));
  if (model.layers().empty()) {
    return FieldError("model.layers", "needs at least one layer");
  }

  ModelShapes shapes;
  for (int i = 0; i < model.layers_size(); ++i) {
    const v1::LayerSpec& layer = model.layers(i);
    ASSIGN_OR_RETURN(Shape out,
                     InferOutputShape(layer, shape, dtype,
                                      absl::StrCat("model.layers[", i, "]")));
    shapes.costs.push_back(EstimateCost(layer, shape, out));
    shapes.inputs.push_back(std::move(shape));
    shapes.outputs.push_back(out);
    shape = std::move(out);
    dtype = DType::kF32;  // every layer, the embedding included, emits floats
  }

  if (model.loss().kind_case() == v1::LossSpec::KIND_NOT_SET) {
    return FieldError("model.loss",
                      "no loss set (expected softmax_cross_entropy)");
  }
  if (shape.rank() != 1 && shape.rank() != 2) {
    return FieldError("model.loss",
                      "softmax_cross_entropy needs a final output of [C] "
                      "classes or [T, V] per token, got ",
                      shape.ToString());
  }
  return shapes;
}

absl::StatusOr<std::vector<StateShape>> ModelStateShapes(
    const v1::ModelSpec& model) {
  ASSIGN_OR_RETURN(const ModelShapes shapes, InferModelShapes(model));
  std::vector<StateShape> out;
  for (int i = 0; i < model.layers_size(); ++i) {
    const v1::LayerSpec& layer = model.layers(i);
    const std::string at = absl::StrCat("layers.", i, ".");
    const auto add = [&](const std::string& name, Shape shape,
                         bool parameter = true) {
      out.push_back({at + name, std::move(shape), parameter});
    };
    // As layer_factory.cc builds them (the defaults too).
    const auto linear = [&](const std::string& p, int64_t in, int64_t n,
                            bool bias) {
      add(p + "weight", {n, in});
      if (bias) add(p + "bias", {n});
    };
    const auto norm = [&](const std::string& p, int64_t features) {
      add(p + "weight", {features});
      add(p + "bias", {features});
    };
    switch (layer.kind_case()) {
      case v1::LayerSpec::kLinear: {
        const v1::Linear& l = layer.linear();
        linear("", l.in_features(), l.out_features(),
               !l.has_bias() || l.bias());
        break;
      }
      case v1::LayerSpec::kLayerNorm:
        norm("", layer.layer_norm().features());
        break;
      case v1::LayerSpec::kEmbedding: {
        const v1::Embedding& e = layer.embedding();
        add("token_weight", {e.vocab_size(), e.dim()});
        add("position_weight", {e.max_positions(), e.dim()});
        break;
      }
      case v1::LayerSpec::kSelfAttention: {
        const int64_t dim = layer.self_attention().dim();
        linear("qkv.", dim, 3 * dim, true);
        linear("proj.", dim, dim, true);
        break;
      }
      case v1::LayerSpec::kTransformerBlock: {
        const v1::TransformerBlock& b = layer.transformer_block();
        const int64_t dim = b.dim();
        const int64_t hidden = b.mlp_hidden() > 0 ? b.mlp_hidden() : 4 * dim;
        norm("ln1.", dim);
        linear("attn.qkv.", dim, 3 * dim, true);
        linear("attn.proj.", dim, dim, true);
        norm("ln2.", dim);
        linear("mlp.fc1.", dim, hidden, true);
        linear("mlp.fc2.", hidden, dim, true);
        break;
      }
      case v1::LayerSpec::kConv2D: {
        const v1::Conv2d& c = layer.conv2d();
        add("weight", {c.out_channels(), shapes.inputs[i].dims()[0],
                       c.kernel_size(), c.kernel_size()});
        if (!c.has_bias() || c.bias()) add("bias", {c.out_channels()});
        break;
      }
      case v1::LayerSpec::kBatchNorm: {
        const int64_t channels = shapes.inputs[i].dims()[0];
        norm("", channels);
        add("running_mean", {channels}, /*parameter=*/false);
        add("running_var", {channels}, /*parameter=*/false);
        break;
      }
      default:
        break;  // no state
    }
  }
  return out;
}

}  // namespace gpipe
