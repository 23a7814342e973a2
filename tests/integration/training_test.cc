// The examples train to the accuracies the README promises, with the
// reference trainer on 2 cores in a couple of minutes each.
#include <string>

#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/reference_trainer.h"

namespace gpipe {
namespace {

double TrainAndEvaluate(const std::string& example) {
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
  return e.accuracy;
}

TEST(Training, FashionMnistMlpReaches85Percent) {
  EXPECT_GE(TrainAndEvaluate("fashion_mnist_mlp.json"), 0.85);
}

TEST(Training, FashionMnistCnnReaches88Percent) {
  EXPECT_GE(TrainAndEvaluate("fashion_mnist_cnn.json"), 0.88);
}

TEST(Training, TransformerLearnsReverseTo95PercentTokens) {
  EXPECT_GE(TrainAndEvaluate("char_transformer.json"), 0.95);
}

}  // namespace
}  // namespace gpipe
