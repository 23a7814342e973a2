#include "tests/support/controller_fixtures.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/storage/checkpoint_layout.h"
#include "services/storage/sha256.h"

namespace gpipe::test_support {
namespace {

constexpr std::string_view kSpecJson = R"({
  "name": "controller-test",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [16]}},
    "layers": [
      {"linear": {"in_features": 16, "out_features": 32}},
      {"relu": {}},
      {"linear": {"in_features": 32, "out_features": 32}},
      {"relu": {}},
      {"linear": {"in_features": 32, "out_features": 4}}
    ],
    "loss": {"softmax_cross_entropy": {}}
  },
  "optimizer": {"lr": 0.05, "sgd": {}},
  "data": {"synthetic": {"task": "CLASSES", "features": 16, "classes": 4,
                         "train_samples": 512}},
  "pipeline": {"stages": 2, "micro_batches": 4},
  "batch_size": 32,
  "steps": 10
})";

}  // namespace

gpipe::v1::JobSpec ParseSpec(std::string_view json) {
  gpipe::v1::JobSpec spec;
  const auto status =
      google::protobuf::util::JsonStringToMessage(std::string(json), &spec);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return spec;
}

gpipe::v1::JobSpec ControllerSpec(int64_t stages) {
  gpipe::v1::JobSpec spec = ParseSpec(kSpecJson);
  spec.mutable_pipeline()->set_stages(stages);
  return spec;
}

gpipe::v1::JobSpec RecoverableSpec(int64_t stages, int64_t max_restarts) {
  gpipe::v1::JobSpec spec = ControllerSpec(stages);
  spec.mutable_checkpoint()->set_every(2);
  spec.set_max_restarts(max_restarts);
  return spec;
}

gpipe::v1::WorkerMessage Progressed(const gpipe::v1::Assignment& a,
                                    int64_t step) {
  gpipe::v1::WorkerMessage m;
  gpipe::v1::StepProgress& p = *m.mutable_progress();
  p.set_job_id(a.job_id());
  p.set_epoch(a.epoch());
  p.set_stage(a.stage());
  p.set_replica(a.replica());
  p.set_step(step);
  return m;
}

gpipe::v1::WorkerMessage Checkpointed(const gpipe::v1::Assignment& a,
                                      int64_t step, std::string bytes) {
  if (bytes.empty())
    bytes = absl::StrCat("stage ", a.stage(), " at step ", step);
  const std::string path = storage::StageFilePath(
      storage::CheckpointStepDir(a.checkpoint_dir(), step), a.epoch(),
      a.stage());
  std::filesystem::create_directories(
      std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
  gpipe::v1::WorkerMessage m;
  gpipe::v1::StageCheckpointed& c = *m.mutable_checkpointed();
  c.set_job_id(a.job_id());
  c.set_epoch(a.epoch());
  c.set_stage(a.stage());
  c.set_step(step);
  c.set_path(path);
  c.set_sha256(storage::Sha256Hex(bytes));
  c.set_bytes(static_cast<int64_t>(bytes.size()));
  c.set_layer_begin(a.layer_begin());
  c.set_layer_end(a.layer_end());
  return m;
}

}  // namespace gpipe::test_support
