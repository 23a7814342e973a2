// The examples train to the accuracies the README promises, with the
// reference trainer on 2 cores in a couple of minutes each.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/nn/generator.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/reference_trainer.h"

namespace gpipe {
namespace {

// Trains the example to its last step; its test accuracy, and the trainer
// in `trained` when given.
double TrainAndEvaluate(const std::string& example,
                        std::unique_ptr<ReferenceTrainer>* trained = nullptr) {
  auto spec =
      LoadJobSpecFile(std::string(GPIPE_SOURCE_DIR) + "/examples/" + example);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return 0;
  auto trainer = ReferenceTrainer::Create(*spec);
  if (!trainer.ok() && absl::IsNotFound(trainer.status())) {
    ADD_FAILURE() << "dataset missing (scripts/setup.sh installs it): "
                  << trainer.status();
    return 0;
  }
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return 0;
  double last_loss = 0;
  while ((*trainer)->step() < spec->steps()) {
    auto r = (*trainer)->Step();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return 0;
    last_loss = r->loss;
  }
  const absl::StatusOr<EvalResult> evaluated =
      (*trainer)->Evaluate(Split::kTest);
  EXPECT_TRUE(evaluated.ok()) << evaluated.status();
  if (!evaluated.ok()) return 0;
  const EvalResult& e = *evaluated;
  std::printf("%s: last train loss %.4f, test loss %.4f, test accuracy %.4f\n",
              example.c_str(), last_loss, e.loss, e.accuracy);
  if (trained != nullptr) *trained = std::move(*trainer);
  return e.accuracy;
}

TEST(Training, FashionMnistMlpReaches85Percent) {
  EXPECT_GE(TrainAndEvaluate("fashion_mnist_mlp.json"), 0.85);
}

TEST(Training, FashionMnistCnnReaches88Percent) {
  EXPECT_GE(TrainAndEvaluate("fashion_mnist_cnn.json"), 0.88);
}

// And then generates: given eight symbols and the separator, it writes
// them reversed, one token at a time through the key/value cache.
TEST(Training, TransformerLearnsReverseTo95PercentTokens) {
  std::unique_ptr<ReferenceTrainer> trainer;
  EXPECT_GE(TrainAndEvaluate("char_transformer.json", &trainer), 0.95);
  ASSERT_NE(trainer, nullptr);
  auto generator = Generator::Create(&trainer->model());
  ASSERT_TRUE(generator.ok()) << generator.status();
  const int32_t separator = 16;
  std::mt19937 rng(3);
  int64_t right = 0, total = 0;
  for (int n = 0; n < 20; ++n) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 8; ++i) prompt.push_back(rng() % 16);
    prompt.push_back(separator);
    auto g = Generator::Create(&trainer->model());
    ASSERT_TRUE(g.ok());
    SamplingOptions greedy;
    greedy.tokens = 8;
    greedy.temperature = 0;
    auto out = (*g)->Generate(prompt, greedy);
    ASSERT_TRUE(out.ok()) << out.status();
    for (int i = 0; i < 8; ++i) {
      right += (*out)[i] == prompt[7 - i];
      ++total;
    }
  }
  std::printf("generated reversals: %lld of %lld tokens right\n",
              static_cast<long long>(right), static_cast<long long>(total));
  EXPECT_GE(right, total * 9 / 10);
}

}  // namespace
}  // namespace gpipe
