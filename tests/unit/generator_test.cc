// Generation with a key/value cache: every position's scores are bitwise
// those of recomputing the whole sequence at once (and within rounding of a
// batched forward), and again after the context window slides; the same seed
// samples the same tokens; models that cannot generate are refused.
#include "services/nn/generator.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

gpipe::v1::ModelSpec Spec(bool causal = true) {
  gpipe::v1::ModelSpec spec;
  const std::string json = std::string(R"({
    "input": {"dtype": "INT32", "shape": {"dims": [12]}},
    "layers": [
      {"embedding": {"vocab_size": 11, "dim": 16, "max_positions": 12}},
      {"transformer_block": {"dim": 16, "heads": 2, "dropout": 0.1,
                             "causal": )") +
                           (causal ? "true" : "false") + R"(}},
      {"transformer_block": {"dim": 16, "heads": 4}},
      {"layer_norm": {"features": 16}},
      {"linear": {"in_features": 16, "out_features": 11}}
    ],
    "loss": {"softmax_cross_entropy": {}}
  })";
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &spec).ok());
  return spec;
}

// The scores of every position of `ids` from one evaluation forward.
std::vector<std::vector<float>> FullForward(Model& model,
                                            const std::vector<int32_t>& ids) {
  Tensor x = Tensor::Empty({1, static_cast<int64_t>(ids.size())}, DType::kI32);
  std::copy(ids.begin(), ids.end(), x.i32());
  LayerContext ctx;
  ctx.training = false;
  const Tensor y = model.Forward(x, ctx, nullptr);
  std::vector<std::vector<float>> rows;
  for (size_t t = 0; t < ids.size(); ++t) {
    rows.emplace_back(y.f32() + t * 11, y.f32() + (t + 1) * 11);
  }
  return rows;
}

bool Bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The scores after `ids` recomputed from nothing: every position run at
// once through a fresh cache.
std::vector<float> Recomputed(Model& model, const std::vector<int32_t>& ids) {
  auto g = Generator::Create(&model);
  EXPECT_TRUE(g.ok());
  return (*g)->Feed(ids);
}

TEST(GeneratorTest, CachedScoresAreBitwiseTheFullRecompute) {
  auto model = Model::Build(Spec(), 3);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> ids = {4, 1, 9, 9, 0, 10, 3, 7, 2, 5};
  const auto forward = FullForward(**model, ids);

  auto g = Generator::Create(model->get());
  ASSERT_TRUE(g.ok()) << g.status();
  // A prompt of three at once, then one at a time.
  std::vector<float> s = (*g)->Feed({ids[0], ids[1], ids[2]});
  for (size_t t = 2; t < ids.size(); ++t) {
    if (t > 2) s = (*g)->Feed({ids[t]});
    const std::vector<int32_t> prefix(ids.begin(), ids.begin() + t + 1);
    EXPECT_TRUE(Bitwise(s, Recomputed(**model, prefix))) << "position " << t;
    // And what a batched forward computes, up to the rounding its GEMM's
    // blocking changes with the row count.
    for (size_t v = 0; v < s.size(); ++v) {
      EXPECT_NEAR(s[v], forward[t][v], 1e-5f * (1 + std::abs(forward[t][v])));
    }
  }
  EXPECT_EQ((*g)->context_length(), 10);
}

TEST(GeneratorTest, AFullWindowSlidesAndStaysExact) {
  auto model = Model::Build(Spec(), 4);
  ASSERT_TRUE(model.ok());
  auto g = Generator::Create(model->get());
  ASSERT_TRUE(g.ok());
  std::vector<int32_t> ids;
  for (int i = 0; i < 13; ++i) ids.push_back((i * 7 + 2) % 11);
  (*g)->Feed(std::vector<int32_t>(ids.begin(), ids.begin() + 12));
  EXPECT_EQ((*g)->context_length(), 12);
  // Full at 12: the last 6 are kept and run again, then the 13th follows.
  const std::vector<float> s = (*g)->Feed({ids[12]});
  EXPECT_EQ((*g)->context_length(), 7);
  EXPECT_TRUE(Bitwise(s, Recomputed(**model, std::vector<int32_t>(
                                                 ids.begin() + 6, ids.end()))));
}

TEST(GeneratorTest, StagesGiveTheScoresOfTheWholeModel) {
  // The whole model and the same parameters as stages of 2, 1 and 2 layers
  // (each with its own caches), through a window slide.
  auto whole = Model::Build(Spec(), 3);
  ASSERT_TRUE(whole.ok());
  std::vector<std::unique_ptr<Model>> stages;
  std::vector<Model*> parts;
  for (auto [begin, end] : {std::pair{0, 2}, {2, 3}, {3, 5}}) {
    auto stage = Model::Build(Spec(), 3, begin, end);
    ASSERT_TRUE(stage.ok());
    parts.push_back(stage->get());
    stages.push_back(std::move(*stage));
  }
  auto one = Generator::Create(whole->get());
  auto three = Generator::Create(parts);
  ASSERT_TRUE(one.ok() && three.ok());
  for (int32_t id : {1, 5, 2, 9, 9, 0, 3, 7, 4, 6, 8, 10, 2, 2, 5, 1}) {
    EXPECT_TRUE(Bitwise((*one)->Feed({id}), (*three)->Feed({id})));
  }
  std::swap(parts[1], parts[2]);
  EXPECT_THAT(Generator::Create(parts).status().message(),
              HasSubstr("consecutive stages"));
}

TEST(GeneratorTest, TheSameSeedSamplesTheSameTokens) {
  auto model = Model::Build(Spec(), 5);
  ASSERT_TRUE(model.ok());
  SamplingOptions o;
  o.tokens = 30;
  o.temperature = 1.5f;
  o.top_k = 6;
  const auto run = [&](uint64_t seed) {
    auto g = Generator::Create(model->get());
    EXPECT_TRUE(g.ok());
    o.seed = seed;
    std::vector<int32_t> streamed;
    auto out =
        (*g)->Generate({1, 2}, o, [&](int32_t id) { streamed.push_back(id); });
    EXPECT_TRUE(out.ok());
    EXPECT_EQ(*out, streamed);
    return *out;
  };
  const auto a = run(9), b = run(9), c = run(10);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a.size(), 30u);
  for (int32_t id : a) EXPECT_TRUE(id >= 0 && id < 11);

  // Temperature 0 is the most likely token each time, whatever the seed.
  o.temperature = 0;
  EXPECT_EQ(run(1), run(2));
}

// A text model's vocabulary may be shorter than its V scores: the ids past
// it have no byte, so they are never sampled, nor taken in a prompt.
TEST(GeneratorTest, AShorterVocabularyIsNeverSampledPast) {
  auto model = Model::Build(Spec(), 5);
  ASSERT_TRUE(model.ok());
  SamplingOptions o;
  o.tokens = 200;
  o.temperature = 50.0f;  // nearly uniform over what may be sampled
  o.vocabulary = 3;
  auto g = Generator::Create(model->get());
  ASSERT_TRUE(g.ok());
  auto out = (*g)->Generate({1, 2}, o);
  ASSERT_TRUE(out.ok()) << out.status();
  for (int32_t id : *out) EXPECT_TRUE(id >= 0 && id < 3) << id;
  EXPECT_THAT((*g)->Generate({5}, o).status().message(),
              HasSubstr("prompt token 5 is outside the vocabulary of 3"));
}

TEST(GeneratorTest, ModelsThatCannotGenerateAreRefused) {
  auto model = Model::Build(Spec(/*causal=*/false), 3);
  ASSERT_TRUE(model.ok());
  EXPECT_THAT(Generator::Create(model->get()).status().message(),
              HasSubstr("layer 1 (transformer_block) looks ahead"));
  gpipe::v1::ModelSpec mlp;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(R"({
    "input": {"dtype": "FLOAT32", "shape": {"dims": [4]}},
    "layers": [{"linear": {"in_features": 4, "out_features": 2}}],
    "loss": {"softmax_cross_entropy": {}}})",
                                                          &mlp)
                  .ok());
  auto classifier = Model::Build(mlp, 1);
  ASSERT_TRUE(classifier.ok());
  EXPECT_THAT(Generator::Create(classifier->get()).status().message(),
              HasSubstr("layer 0 is linear, not an embedding"));
  auto g = Generator::Create(Model::Build(Spec(), 3)->get());
  ASSERT_TRUE(g.ok());
  EXPECT_THAT((*g)->Generate({}, SamplingOptions()).status().message(),
              HasSubstr("the prompt is empty"));
  EXPECT_THAT((*g)->Generate({11}, SamplingOptions()).status().message(),
              HasSubstr("prompt token 11 is outside the vocabulary of 11"));
}

}  // namespace
}  // namespace gpipe
