#include "services/nn/generator.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/core/strings.h"
#include "services/nn/layers/embedding.h"

namespace gpipe {

absl::StatusOr<std::unique_ptr<Generator>> Generator::Create(Model* model) {
  return Create(std::vector<Model*>{model});
}

absl::StatusOr<std::unique_ptr<Generator>> Generator::Create(
    std::vector<Model*> stages) {
  int64_t next = 0;
  for (Model* stage : stages) {
    if (stage->size() == 0 || stage->begin() != next) {
      return absl::FailedPreconditionError(
          "generation needs the whole model, from its first layer, in "
          "consecutive stages");
    }
    next = stage->end();
  }
  if (stages.empty()) {
    return absl::FailedPreconditionError("generation needs a model");
  }
  auto* embedding = dynamic_cast<Embedding*>(&stages[0]->layer(0));
  if (embedding == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation needs a language model: layer 0 is ",
        AsAbsl(stages[0]->layer(0).kind()), ", not an embedding of token ids"));
  }
  for (Model* stage : stages) {
    for (int64_t i = 0; i < stage->size(); ++i) {
      if (!stage->layer(i).Decodes()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "layer ", stage->begin() + i, " (", AsAbsl(stage->layer(i).kind()),
            ") looks ahead (causal: false): a model that generates sees only "
            "the tokens before each position"));
      }
    }
  }
  return std::unique_ptr<Generator>(new Generator(
      std::move(stages), embedding->max_positions(), embedding->vocab_size()));
}

Generator::Generator(std::vector<Model*> stages, int64_t max_positions,
                     int64_t vocab)
    : stages_(std::move(stages)), max_positions_(max_positions), vocab_(vocab) {
  for (Model* stage : stages_) {
    states_.emplace_back(static_cast<size_t>(stage->size()));
    for (DecodeState& s : states_.back()) s.capacity = max_positions_;
  }
}

std::vector<float> Generator::Run(const std::vector<int32_t>& ids) {
  Tensor x = Tensor::Empty({1, static_cast<int64_t>(ids.size())}, DType::kI32);
  std::copy(ids.begin(), ids.end(), x.i32());
  Tensor h = x;
  for (size_t s = 0; s < stages_.size(); ++s) {
    // Each stage decodes where its parameters are: the previous stage's
    // output goes there first (the ids stay on the host: the embedding
    // takes them from anywhere).
    const auto& params = stages_[s]->Parameters();
    if (s > 0 && !params.empty()) {
      h = h.To(params.front().param->value.device());
    }
    h = stages_[s]->Decode(h, length_, &states_[s]);
  }
  const Tensor scores = h.To(Device::kCpu);
  length_ += static_cast<int64_t>(ids.size());
  context_.insert(context_.end(), ids.begin(), ids.end());
  const int64_t v = scores.dim(scores.rank() - 1);
  const float* last = scores.f32() + scores.numel() - v;
  return std::vector<float>(last, last + v);
}

std::vector<float> Generator::Feed(const std::vector<int32_t>& ids) {
  std::vector<float> scores;
  size_t at = 0;
  while (at < ids.size()) {
    if (length_ == max_positions_) {
      // Full: keep the last half and run it again from position 0.
      std::vector<int32_t> kept(context_.end() - max_positions_ / 2,
                                context_.end());
      context_.clear();
      length_ = 0;
      for (std::vector<DecodeState>& stage : states_)
        for (DecodeState& s : stage) s.qkv = Tensor();
      if (!kept.empty()) scores = Run(kept);
    }
    const size_t room = static_cast<size_t>(max_positions_ - length_);
    const size_t n = std::min(room, ids.size() - at);
    scores = Run(std::vector<int32_t>(ids.begin() + at, ids.begin() + at + n));
    at += n;
  }
  return scores;
}

int64_t Generator::SampledVocabulary(const SamplingOptions& o) const {
  return o.vocabulary > 0 ? std::min(o.vocabulary, vocab_) : vocab_;
}

int32_t Generator::Sample(const std::vector<float>& scores,
                          const SamplingOptions& o,
                          std::mt19937_64& rng) const {
  const int64_t v =
      std::min(SampledVocabulary(o), static_cast<int64_t>(scores.size()));
  std::vector<int64_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  // Highest score first, the lower id first among equals: deterministic.
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  if (o.temperature <= 0) return static_cast<int32_t>(order[0]);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, v) : v;
  std::vector<double> p(k);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[i] = std::exp((static_cast<double>(scores[order[i]]) - scores[order[0]]) /
                    o.temperature);
    sum += p[i];
  }
  // 53 random bits as a double in [0, 1): the engine's output is fixed by
  // the standard, so the draw is the same on every machine.
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (int64_t i = 0; i < k; ++i) {
    acc += p[i];
    if (u < acc) return static_cast<int32_t>(order[i]);
  }
  return static_cast<int32_t>(order[k - 1]);
}

absl::StatusOr<std::vector<int32_t>> Generator::Generate(
    const std::vector<int32_t>& prompt, const SamplingOptions& options,
    const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError("the prompt is empty: give one token");
  }
  const int64_t vocab = SampledVocabulary(options);
  for (int32_t id : prompt) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt token ", id, " is outside the vocabulary of ", vocab));
    }
  }
  std::mt19937_64 rng(options.seed);
  std::vector<float> scores = Feed(prompt);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(options.tokens));
  for (int64_t i = 0; i < options.tokens; ++i) {
    const int32_t next = Sample(scores, options, rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 < options.tokens) scores = Feed({next});
  }
  return out;
}

}  // namespace gpipe
