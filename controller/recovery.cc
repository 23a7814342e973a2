#include "controller/recovery.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/core/log.h"
#include "services/core/status.h"
#include "services/storage/manifest.h"

namespace gpipe::controller {

namespace v1 = gpipe::v1;

std::string CheckpointStepDir(const std::string& checkpoint_dir,
                              const std::string& job_id, int64_t step) {
  return (std::filesystem::path(checkpoint_dir) / job_id /
          absl::StrCat("step-", step))
      .string();
}

namespace {

std::string StageFileName(int64_t epoch, int64_t stage) {
  return absl::StrCat("e", epoch, "-stage-", stage, ".safetensors");
}

}  // namespace

absl::Status CheckCheckpointReport(const std::string& checkpoint_dir,
                                   const v1::StageCheckpointed& report,
                                   int64_t every, int64_t total_steps) {
  if (every <= 0 || report.step() <= 0 || report.step() >= total_steps ||
      report.step() % every != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", report.step(), " is not a checkpoint step (every ", every,
        ", ", total_steps, " steps)"));
  }
  const std::string want =
      (std::filesystem::path(
           CheckpointStepDir(checkpoint_dir, report.job_id(), report.step())) /
       StageFileName(report.epoch(), report.stage()))
          .string();
  if (std::filesystem::path(report.path()).lexically_normal().string() !=
      want) {
    return absl::InvalidArgumentError(
        absl::StrCat("path ", report.path(), " is not ", want));
  }
  if (report.sha256().size() != 64 || report.bytes() <= 0 ||
      report.layer_end() <= report.layer_begin()) {
    return absl::InvalidArgumentError(
        "the report lacks a sha256, a size or a layer range");
  }
  return absl::OkStatus();
}

absl::Status CheckFinishedReport(const std::string& checkpoint_dir,
                                 const v1::StageFinished& report) {
  const std::string want =
      (std::filesystem::path(checkpoint_dir) / report.job_id() / "final" /
       StageFileName(report.epoch(), report.stage()))
          .lexically_normal()
          .string();
  if (std::filesystem::path(report.parameters_path())
          .lexically_normal()
          .string() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters_path ", report.parameters_path(), " is not ", want));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CheckpointRef> CommitCheckpoint(
    const std::string& checkpoint_dir, const std::string& job_id, int64_t epoch,
    const std::vector<v1::StageCheckpointed>& reports) {
  if (reports.empty()) {
    return absl::InvalidArgumentError("a checkpoint needs at least one stage");
  }
  const int64_t step = reports.front().step();
  v1::CheckpointManifest manifest;
  manifest.set_job_id(job_id);
  manifest.set_step(step);
  manifest.set_epoch(epoch);
  for (const v1::StageCheckpointed& r : reports) {
    v1::CheckpointFile* f = manifest.add_files();
    f->set_path(std::filesystem::path(r.path()).filename().string());
    f->set_sha256(r.sha256());
    f->set_bytes(r.bytes());
    f->set_stage(r.stage());
    f->set_layer_begin(r.layer_begin());
    f->set_layer_end(r.layer_end());
  }
  v1::CheckpointRef ref;
  ref.set_step(step);
  ref.set_manifest_path(
      (std::filesystem::path(CheckpointStepDir(checkpoint_dir, job_id, step)) /
       storage::kManifestName)
          .string());
  RETURN_IF_ERROR(storage::WriteManifest(ref.manifest_path(), manifest));
  return ref;
}

void KeepCheckpoints(v1::JobStatus* status, v1::CheckpointRef ref,
                     int64_t keep) {
  if (keep <= 0) keep = 3;
  // A checkpoint of the same step (a replay committed it again) replaces
  // the older entry: the same directory holds both.
  auto* list = status->mutable_checkpoints();
  for (int i = list->size() - 1; i >= 0; --i) {
    if (list->Get(i).step() >= ref.step()) list->DeleteSubrange(i, 1);
  }
  *list->Add() = std::move(ref);
  while (list->size() > keep) {
    const std::filesystem::path dir =
        std::filesystem::path(list->Get(0).manifest_path()).parent_path();
    std::error_code error;
    std::filesystem::remove_all(dir, error);
    if (error) {
      LogWarning("cannot remove old checkpoint %s: %s", dir.string(),
                 error.message());
    }
    list->DeleteSubrange(0, 1);
  }
}

std::optional<v1::CheckpointRef> ChooseRestorePoint(const std::string& job_id,
                                                    v1::JobStatus* status,
                                                    int64_t* corrupt) {
  auto* list = status->mutable_checkpoints();
  while (!list->empty()) {
    const v1::CheckpointRef& newest = list->Get(list->size() - 1);
    absl::StatusOr<v1::CheckpointManifest> manifest =
        storage::ReadVerifiedManifest(newest.manifest_path());
    if (manifest.ok() && manifest->step() == newest.step()) return newest;
    const absl::Status why =
        manifest.ok() ? absl::DataLossError(absl::StrCat(
                            newest.manifest_path(), " is of step ",
                            manifest->step(), ", not ", newest.step()))
                      : manifest.status();
    ++*corrupt;
    LogError(
        "job %s: checkpoint of step %d is unusable, falling back to "
        "the one before: %s",
        job_id, newest.step(), why.ToString());
    list->RemoveLast();
  }
  return std::nullopt;
}

}  // namespace gpipe::controller
