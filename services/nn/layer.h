// The Layer interface: one explicit forward and one explicit backward per
// layer (llm.c style). A forward records what its backward needs in a Saved
// record owned by the caller, so a stage can keep many micro-batches in
// flight, drop them (re-materialization) and recompute them later.
#ifndef GPIPE_SERVICES_NN_LAYER_H_
#define GPIPE_SERVICES_NN_LAYER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "services/core/rng.h"
#include "services/nn/weight_groups.h"
#include "services/tensor/tensor.h"

namespace gpipe {

// A trainable tensor and its gradient accumulator.
struct Parameter {
  std::string name;  // stable within the layer: "weight", "bias", ...
  Tensor value;
  Tensor grad;
  bool decay = true;  // weight decay applies (not to biases and norm scales)
  // Set by a layer that makes every gradient of this parameter with one
  // product on the CPU that can start its chain from +0 instead of from
  // what the gradient holds (Linear's weight). Model::ZeroGrad then only
  // marks the gradient unwritten, and the step's first product overwrites
  // it: the same bits as adding onto zeros, without a pass zeroing the
  // whole weight's gradient and the product reading those zeros back.
  bool first_gradient_overwrites = false;
  // The gradient is zero whatever `grad` holds; the next product
  // overwrites it. Set only by Model::ZeroGrad, and only on the CPU; every
  // step's backward writes the gradient before anything reads it (the
  // gradient norm, the exchange between replicas, the update).
  bool grad_unwritten = false;
};

// Non-trainable state that checkpoints keep (BatchNorm running averages).
struct NamedBuffer {
  std::string name;
  Tensor* value;
};

class RunningStatistics;

// Where a forward runs: everything that makes it reproducible.
struct LayerContext {
  bool training = true;
  // A re-materialized forward: same numbers, but no side effects such as
  // updating running averages a second time.
  bool recompute = false;
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t micro_batch = 0;
  int64_t layer_index = 0;  // global index of the layer in the model
  // Whether the caller uses the input gradient Backward returns. False for
  // the model's first layer, whose input is data: Linear and Conv2d then
  // skip that product (a GEMM the size of the weight gradient's) and return
  // an undefined tensor. Parameter gradients do not depend on it.
  bool input_grad = true;
  // Where a training forward (not re-materialized) records the statistics
  // its buffers would follow (Layer::RunningStatisticsSize) instead of
  // moving them; null: it moves them itself. Not owned.
  RunningStatistics* running_statistics = nullptr;

  // The dropout key of this layer for this (step, micro-batch); `sub` tells
  // apart several dropouts inside one layer.
  uint64_t DropoutKey(uint64_t sub = 0) const {
    return MixKey({seed, 0x64726f70ULL, static_cast<uint64_t>(step),
                   static_cast<uint64_t>(micro_batch),
                   static_cast<uint64_t>(layer_index), sub});
  }
};

// Whether anything takes the input gradient of the model's layer at this
// global index: not of the first, whose input is data.
inline bool InputGradUsed(int64_t layer_index) { return layer_index > 0; }

// What a forward keeps for its backward.
struct Saved {
  // Keeps `t` under `name` (replacing an earlier one of that name).
  void Put(std::string_view name, Tensor t);
  // The tensor the forward kept under `name`. Asking for a name it did not
  // keep is a bug in the layer: an undefined tensor, and an assertion in
  // debug builds.
  const Tensor& Get(std::string_view name) const;
  int64_t bytes() const;
  // Forgets the tensor kept under `name`, if any.
  void Drop(std::string_view name);
  void Clear() {
    tensors_.clear();
    children.clear();
  }

  std::vector<Saved> children;  // composite layers: one per sub-layer

 private:
  // By name, so a forward and its backward cannot disagree on an order
  // (and a backward split in two finds what each half needs). A layer
  // keeps at most a few: a linear search.
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

// What the partitioner balances with, and what the memory model
// (services/pipeline/memory_model.h) adds up.
struct LayerCost {
  double forward_flops = 0;  // per sample
  // What of a split backward's two halves is the weight half, per sample:
  // the parameters' GEMMs (as large as the forward's), not attention's
  // products of activations, whose gradients the input half computes. 0
  // for a layer with no weight half (deferred_bytes 0).
  double weight_flops = 0;
  int64_t param_bytes = 0;
  int64_t buffer_bytes = 0;  // non-trainable state (running averages)
  // Linear weights packed for the CPU GEMM (PackedWeight), twice each: for
  // the forward and for the input gradient. An upper bound on any CPU; a
  // GPU worker holds none.
  int64_t packed_weight_bytes = 0;
  int64_t activation_bytes = 0;  // output bytes per sample
  // What a training forward keeps for its backward (its Saved record).
  // The input and output are the neighbours' tensors: the flags say whether
  // they are kept, and the model counts each boundary tensor once.
  bool keeps_input = false;
  bool keeps_output = false;
  bool output_is_input = false;  // a view of the input (Flatten, p=0 dropout)
  // The input itself outside training (dropout).
  bool evaluation_passes_input = false;
  int64_t saved_bytes = 0;        // fresh tensors kept, per sample
  int64_t saved_fixed_bytes = 0;  // fresh tensors kept, per micro-batch
  // Temporaries of one forward or backward beyond its input, output and
  // their gradients, per sample (im2col columns, attention's score
  // gradients).
  int64_t workspace_bytes = 0;
  // Samples whose workspace is held at once when the layer works in chunks
  // (a convolution's im2col); 0: all of them.
  int64_t workspace_samples = 0;
  // The most an evaluation forward holds at once beyond its input and
  // output, per sample: a composite layer's inner tensors as they come and
  // go (attention's q/k/v and probabilities), a convolution's columns (of a
  // chunk: workspace_samples), a norm's statistics.
  int64_t forward_temp_bytes = 0;
  // What a split backward keeps between its halves besides the Saved
  // record, per sample: the output gradients of the layer's GEMMs
  // (Layer::BackwardInput's `deferred`).
  int64_t deferred_bytes = 0;
  // A layer whose weight halves a CPU trainer groups over micro-batches
  // (Layer::GroupsWeightHalves, weight_groups.h): its product's rows per
  // sample, and what a micro-batch holds for the group per sample (the
  // product's operands); 0 for the others.
  int64_t weight_group_rows = 0;
  int64_t weight_group_held_bytes = 0;
  // What of the Saved record the input half leaves for the weight half:
  // the input (a GEMM's operand), and fresh tensors per sample (a composite
  // layer's inner GEMMs' inputs).
  bool weight_keeps_input = false;
  int64_t weight_saved_bytes = 0;
  // A split backward's temporaries, per sample, when they differ from the
  // whole backward's: the input half's (a convolution's column gradients)
  // and the weight half's (its columns, made again); the input half's is
  // `workspace_bytes` and the weight half's 0 otherwise. A layer that
  // computes no input gradient (the model's first) runs only the weight
  // part of its whole backward.
  bool splits_workspace = false;
  int64_t input_workspace_bytes = 0;
  int64_t weight_workspace_bytes = 0;
  // Whether `deferred_bytes` holds the layer's own output gradient (the
  // tensor its backward was handed, kept as its last GEMM's operand)
  // rather than only gradients its backward made.
  bool defers_output_grad = false;
};

// What incremental decoding (generation) keeps of the positions already
// run: attention's rows of q, k and v, so a new token attends to them
// without recomputing them.
struct DecodeState {
  int64_t capacity = 0;  // positions the cache holds at most
  Tensor qkv;            // [B, capacity, 3 * dim], rows < the position
};

// One micro-batch's weight half (Layer::BackwardWeight's arguments).
struct WeightHalf {
  const Saved* saved = nullptr;
  const Saved* deferred = nullptr;
  LayerContext ctx;
};

class Layer {
 public:
  virtual ~Layer() = default;

  virtual std::string_view kind() const = 0;
  // Whether Forward and Backward have kernels for tensors on `device`.
  virtual bool RunsOn(Device device) const { return device == Device::kCpu; }
  // x is [B, input shape...]. `saved` is null when no backward follows.
  virtual Tensor Forward(const Tensor& x, const LayerContext& ctx,
                         Saved* saved) = 0;
  // Returns the input gradient (undefined for integer inputs, and may be
  // undefined when !ctx.input_grad) and adds the parameter gradients into
  // Parameter::grad.
  virtual Tensor Backward(const Tensor& dy, const Saved& saved,
                          const LayerContext& ctx) = 0;

  // The backward in two halves, for schedules that run the weight
  // gradients later to fill bubbles (zero-bubble pipelining): BackwardInput
  // returns what Backward returns, keeps in `deferred` what the other half
  // needs (the output gradients of the layer's GEMMs) and drops from
  // `saved` what it does not read, so a micro-batch waiting for its weight
  // half holds less; BackwardWeight then adds the parameter gradients. The
  // two add exactly what Backward adds, bit for bit: the same kernels on the
  // same operands. Layers whose parameter gradients fall out of the input
  // gradient's own pass (the norms) or that have none keep the default:
  // everything in the first half, nothing deferred, nothing kept. Nothing
  // may write to a tensor `deferred` holds in between.
  virtual Tensor BackwardInput(const Tensor& dy, Saved& saved,
                               const LayerContext& ctx, Saved* deferred) {
    Tensor dx = Backward(dy, saved, ctx);
    saved.Clear();
    return dx;
  }
  virtual void BackwardWeight(const Saved& saved, const Saved& deferred,
                              const LayerContext& ctx) {}
  // The weight halves of several micro-batches, in the order their
  // gradients add up: what BackwardWeight adds for each in turn, bit for
  // bit. Worth it where GroupsWeightHalves says so.
  virtual void BackwardWeights(std::span<const WeightHalf> halves) {
    for (const WeightHalf& h : halves)
      BackwardWeight(*h.saved, *h.deferred, h.ctx);
  }
  // Whether BackwardWeights does several micro-batches' weight halves for
  // less than their BackwardWeight calls: a small micro-batch's product
  // onto a weight gradient reads and writes the whole gradient for a few
  // rows' multiply-adds, where one product over the group's rows does it
  // once. Layers that say so have their weight halves grouped by the
  // trainers (Model::BackwardGrouping); the rest run whole backwards.
  virtual bool GroupsWeightHalves() const { return false; }
  // What a micro-batch brings to a group of weight halves, from what its
  // forward saved (for a layer that groups them).
  virtual WeightGroupCost GroupCost(const Saved& saved) const { return {}; }

  // Incremental decoding: `x` [B, n, ...] holds positions [position,
  // position + n) of each sequence, the positions before them having gone
  // through earlier calls with the same `state`. Layers that act on each
  // position alone compute what an evaluation Forward computes; attention
  // and position embeddings override it, computing for each position
  // exactly what a Forward over the whole sequence computes there.
  virtual Tensor Decode(const Tensor& x, int64_t position, DecodeState* state) {
    LayerContext ctx;
    ctx.training = false;
    return Forward(x, ctx, nullptr);
  }
  // Whether Decode gives what Forward gives (false for attention that
  // looks ahead: a new position would change the earlier ones).
  virtual bool Decodes() const { return true; }

  // Whether `x` is an input this layer can take: InvalidArgument naming
  // what is wrong (a token id outside the vocabulary) for inputs that come
  // from data. The stage and the reference trainer check a model's input
  // before its forward; kernels still never read out of bounds.
  virtual absl::Status CheckInput(const Tensor& x) const {
    return absl::OkStatus();
  }

  virtual std::vector<Parameter*> Parameters() { return {}; }
  // Brings any copy of the parameters kept in another layout for the
  // kernels (a Linear's packed weight on the CPU) up to date now, with the
  // input gradient's too when `input_grad`; the products would otherwise
  // do it on first use. Moves floats only: results are the same bits.
  virtual void PackWeights(bool input_grad) {}
  virtual std::vector<NamedBuffer> Buffers() { return {}; }
  // Buffers that follow the training micro-batches (batch norm's running
  // averages): how many floats a training forward records per micro-batch
  // under a LayerContext::running_statistics (0: no such buffers), and the
  // move by one micro-batch's record, to the bits its forward would have
  // moved them. Host buffers only.
  virtual int64_t RunningStatisticsSize() const { return 0; }
  virtual void ApplyRunningStatistics(const float* record) {}
  // Draws the initial parameters from a key (a pure function of seed and
  // global layer index, so every partition starts from the same model).
  virtual void Initialize(uint64_t key) {}
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYER_H_
