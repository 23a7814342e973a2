// The checkpoint layout: the names stages write and the controller checks
// are one function each, and the parsers accept exactly what they print.
#include "services/storage/checkpoint_layout.h"

#include "gtest/gtest.h"

namespace gpipe::storage {
namespace {

TEST(CheckpointLayout, PathsOfAJob) {
  const std::string job = JobCheckpointDir("/ckpt", "job-7");
  EXPECT_EQ(job, "/ckpt/job-7");
  EXPECT_EQ(CheckpointStepDir(job, 40), "/ckpt/job-7/step-40");
  EXPECT_EQ(FinalParametersDir(job), "/ckpt/job-7/final");
  EXPECT_EQ(MergedModelPath(job), "/ckpt/job-7/model.safetensors");
  EXPECT_EQ(StageFileName(3, 1), "e3-stage-1.safetensors");
  EXPECT_EQ(StageFilePath(CheckpointStepDir(job, 40), 3, 1),
            "/ckpt/job-7/step-40/e3-stage-1.safetensors");
}

TEST(CheckpointLayout, StageFileNamesRoundTrip) {
  for (int64_t epoch : {0, 1, 12, 123456789}) {
    for (int64_t stage : {0, 7, 127}) {
      std::optional<StageFileId> id =
          ParseStageFileName(StageFileName(epoch, stage));
      ASSERT_TRUE(id.has_value());
      EXPECT_EQ(*id, (StageFileId{epoch, stage}));
    }
  }
}

TEST(CheckpointLayout, OtherNamesAreNotStageFiles) {
  for (const char* name :
       {"", "e-stage-1.safetensors", "e1-stage-.safetensors",
        "e01-stage-1.safetensors", "e1-stage-01.safetensors",
        "e-1-stage-1.safetensors", "e1-stage-+1.safetensors",
        "e1-stage-1.safetensors.tmp", "e1-stage-1.bin",
        "x1-stage-1.safetensors", "e1-stage-1-stage-2.safetensors",
        "e1_stage_1.safetensors", "e99999999999999999999-stage-1.safetensors",
        "MANIFEST.json"}) {
    EXPECT_FALSE(ParseStageFileName(name).has_value()) << name;
  }
}

TEST(CheckpointLayout, StepDirectoryNames) {
  EXPECT_EQ(ParseCheckpointStepDirName("step-1"), 1);
  EXPECT_EQ(ParseCheckpointStepDirName("step-4000"), 4000);
  for (const char* name : {"step-0", "step-", "step-01", "step--1", "step-1x",
                           "steps-1", "final", "model.safetensors"}) {
    EXPECT_FALSE(ParseCheckpointStepDirName(name).has_value()) << name;
  }
}

}  // namespace
}  // namespace gpipe::storage
