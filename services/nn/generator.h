// Sampling from a language model (token ids [T] -> scores [T, V]) one token
// at a time with a key/value cache: each new token runs through the model
// once, attending to the cached rows of the tokens before it, so a token
// costs a forward of one position, not of the whole sequence. The scores of
// every position are bitwise those of running the whole sequence through a
// fresh generator at once: its products are row-stable (Linear::Decode),
// so a row's result does not depend on how many rows ran with it. They
// differ from a batched Forward's only by the rounding OpenBLAS's blocking
// changes with the row count.
//
// The model may be split into stages (consecutive layer ranges, each its
// own Model with its own caches): each new token runs through them in
// order, so a model served as K stages gives the same scores as one piece.
// Stages may live on the GPU (each layer's Decode runs where its
// parameters are); the ids go in and the scores come out on the host.
#ifndef GPIPE_SERVICES_NN_GENERATOR_H_
#define GPIPE_SERVICES_NN_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "services/nn/model.h"

namespace gpipe {

struct SamplingOptions {
  int64_t tokens = 200;      // to generate
  float temperature = 1.0f;  // 0: always the most likely token
  int64_t top_k = 0;         // sample among the k most likely; 0: all
  uint64_t seed = 0;
  // Sample only ids below this (a text model's vocabulary may be shorter
  // than its V scores, which then has ids with no byte); 0: all V.
  int64_t vocabulary = 0;
};

class Generator {
 public:
  // `model` (not owned) must be a whole language model: an embedding with
  // positions first, causal attention only, [V] scores per position last.
  // FAILED_PRECONDITION naming the layer otherwise.
  static absl::StatusOr<std::unique_ptr<Generator>> Create(Model* model);
  // The same over `stages` (not owned): consecutive layer ranges from layer
  // 0, in order.
  static absl::StatusOr<std::unique_ptr<Generator>> Create(
      std::vector<Model*> stages);

  // Appends `ids` to the context and returns the scores [V] after its last
  // position. When the context would pass the model's max_positions, its
  // last half is kept and run again from position 0 (positions move, so the
  // cache cannot be kept).
  std::vector<float> Feed(const std::vector<int32_t>& ids);

  // Feeds `prompt` (at least one id), then samples `tokens` ids, calling
  // `on_token` with each as it comes. The same seed gives the same ids.
  absl::StatusOr<std::vector<int32_t>> Generate(
      const std::vector<int32_t>& prompt, const SamplingOptions& options,
      const std::function<void(int32_t)>& on_token = nullptr);

  int64_t context_length() const { return length_; }

 private:
  Generator(std::vector<Model*> stages, int64_t max_positions, int64_t vocab);
  std::vector<float> Run(const std::vector<int32_t>& ids);
  // The ids that may be sampled or prompted: [0, this).
  int64_t SampledVocabulary(const SamplingOptions& o) const;
  int32_t Sample(const std::vector<float>& scores, const SamplingOptions& o,
                 std::mt19937_64& rng) const;

  std::vector<Model*> stages_;
  int64_t max_positions_;
  int64_t vocab_;
  std::vector<std::vector<DecodeState>> states_;  // per stage, per layer
  std::vector<int32_t> context_;  // the ids in the cache, in order
  int64_t length_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_GENERATOR_H_
