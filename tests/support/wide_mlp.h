// A job whose layers are wide enough that CPU stages group their
// micro-batches' weight halves (services/nn/weight_groups.h: over 4 MiB of
// gradients on a stage); the examples' gradients stay in the caches.
#ifndef GPIPE_TESTS_SUPPORT_WIDE_MLP_H_
#define GPIPE_TESTS_SUPPORT_WIDE_MLP_H_

#include <algorithm>
#include <cstdint>

#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"

namespace gpipe::test_support {

// 64 -> 1024 -> 1024 -> 1024 -> 4 with ReLUs, SGD with momentum. At batch
// 32 a group takes up to 8 micro-batches; at 512, 64-row micro-batches go
// 4 to a group.
inline gpipe::v1::JobSpec WideMlp(int64_t batch = 32) {
  auto spec = ParseJobSpecJson(R"({
    "name": "wide-mlp",
    "model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [64]}},
              "layers": [{"linear": {"inFeatures": 64, "outFeatures": 1024}},
                         {"relu": {}},
                         {"linear": {"inFeatures": 1024, "outFeatures": 1024}},
                         {"relu": {}},
                         {"linear": {"inFeatures": 1024, "outFeatures": 1024}},
                         {"relu": {}},
                         {"linear": {"inFeatures": 1024, "outFeatures": 4}}],
              "loss": {"softmaxCrossEntropy": {}}},
    "optimizer": {"lr": 0.01, "sgd": {"momentum": 0.9}},
    "data": {"synthetic": {"task": "CLASSES", "features": 64, "classes": 4,
                           "trainSamples": 1024, "testSamples": 64}},
    "batchSize": 32, "steps": 3, "seed": 3})");
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return gpipe::v1::JobSpec();
  spec->set_batch_size(batch);
  // An evaluation batch as large as a training one.
  spec->mutable_data()->mutable_synthetic()->set_test_samples(
      std::max<int64_t>(64, batch));
  return *spec;
}

}  // namespace gpipe::test_support

#endif  // GPIPE_TESTS_SUPPORT_WIDE_MLP_H_
