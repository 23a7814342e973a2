#include "controller/recovery.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "services/core/log.h"
#include "services/core/status.h"
#include "services/storage/checkpoint_layout.h"
#include "services/storage/file_io.h"
#include "services/storage/manifest.h"
#include "services/storage/sha256.h"

namespace gpipe::controller {

namespace v1 = gpipe::v1;

namespace {

std::string StepDirOf(const std::string& checkpoint_dir,
                      const std::string& job_id, int64_t step) {
  return storage::CheckpointStepDir(
      storage::JobCheckpointDir(checkpoint_dir, job_id), step);
}

}  // namespace

std::string CheckpointFilePath(const std::string& checkpoint_dir,
                               const std::string& job_id, int64_t step,
                               int64_t epoch, int64_t stage) {
  return storage::StageFilePath(StepDirOf(checkpoint_dir, job_id, step), epoch,
                                stage);
}

std::string FinalFilePath(const std::string& checkpoint_dir,
                          const std::string& job_id, int64_t epoch,
                          int64_t stage) {
  return storage::StageFilePath(
      storage::FinalParametersDir(
          storage::JobCheckpointDir(checkpoint_dir, job_id)),
      epoch, stage);
}

absl::Status CheckCheckpointReport(const std::string& checkpoint_dir,
                                   const v1::StageCheckpointed& report,
                                   const StepPlan& plan) {
  if (!plan.CheckpointsAfter(report.step())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", report.step(), " is not a checkpoint step (every ",
        plan.checkpoint_every(), ", ", plan.steps(), " steps)"));
  }
  const std::string want =
      CheckpointFilePath(checkpoint_dir, report.job_id(), report.step(),
                         report.epoch(), report.stage());
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
      std::filesystem::path(FinalFilePath(checkpoint_dir, report.job_id(),
                                          report.epoch(), report.stage()))
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

namespace {

// A stage's report as its manifest lists it (the file by its name).
v1::CheckpointFile ManifestEntry(const v1::StageCheckpointed& r) {
  v1::CheckpointFile f;
  f.set_path(std::filesystem::path(r.path()).filename().string());
  f.set_sha256(r.sha256());
  f.set_bytes(r.bytes());
  f.set_stage(r.stage());
  f.set_layer_begin(r.layer_begin());
  f.set_layer_end(r.layer_end());
  return f;
}

// Writes the manifest of `reports` (their files in `dir`) into `dir`.
absl::StatusOr<v1::CheckpointRef> WriteCommit(
    const std::string& dir, const std::string& job_id, int64_t epoch,
    int64_t step, const std::vector<v1::StageCheckpointed>& reports,
    const v1::JobSpec& spec) {
  v1::CheckpointManifest manifest;
  manifest.set_job_id(job_id);
  manifest.set_step(step);
  manifest.set_epoch(epoch);
  for (const v1::StageCheckpointed& r : reports) {
    *manifest.add_files() = ManifestEntry(r);
  }
  v1::CheckpointRef ref;
  ref.set_step(step);
  ref.set_manifest_path(
      (std::filesystem::path(dir) / storage::kManifestName).string());
  RETURN_IF_ERROR(storage::WriteManifest(ref.manifest_path(), manifest));
  // The spec beside it; the checkpoint stands without it (a job started
  // from it then reads its data afresh), so a failure is only logged.
  std::string json;
  if (spec.ByteSizeLong() > 0 &&
      google::protobuf::util::MessageToJsonString(spec, &json).ok()) {
    const std::string path =
        (std::filesystem::path(dir) / storage::kJobSpecName).string();
    if (absl::Status s = storage::WriteFileAtomically(path, json); !s.ok()) {
      LogWarning("cannot write %s: %s", path, s.ToString());
    }
  }
  return ref;
}

}  // namespace

absl::StatusOr<v1::CheckpointRef> CommitCheckpoint(
    const std::string& checkpoint_dir, const std::string& job_id, int64_t epoch,
    const std::vector<v1::StageCheckpointed>& reports,
    const v1::JobSpec& spec) {
  if (reports.empty()) {
    return absl::InvalidArgumentError("a checkpoint needs at least one stage");
  }
  const int64_t step = reports.front().step();
  return WriteCommit(StepDirOf(checkpoint_dir, job_id, step), job_id, epoch,
                     step, reports, spec);
}

absl::StatusOr<v1::CheckpointRef> CommitFinalParameters(
    const std::string& checkpoint_dir, const std::string& job_id, int64_t epoch,
    int64_t step, std::vector<v1::StageCheckpointed> stages,
    const v1::JobSpec& spec) {
  if (stages.empty()) {
    return absl::InvalidArgumentError("final parameters need a stage");
  }
  for (v1::StageCheckpointed& s : stages) {
    ASSIGN_OR_RETURN(std::string digest, storage::Sha256File(s.path()));
    std::error_code error;
    const auto bytes = std::filesystem::file_size(s.path(), error);
    if (error) {
      return absl::DataLossError(
          absl::StrCat("cannot size ", s.path(), ": ", error.message()));
    }
    s.set_sha256(std::move(digest));
    s.set_bytes(static_cast<int64_t>(bytes));
  }
  return WriteCommit(storage::FinalParametersDir(
                         storage::JobCheckpointDir(checkpoint_dir, job_id)),
                     job_id, epoch, step, stages, spec);
}

bool RemoveFinalParametersRefs(const std::string& checkpoint_dir,
                               const std::string& job_id,
                               v1::JobStatus* status) {
  const std::filesystem::path final_dir = storage::FinalParametersDir(
      storage::JobCheckpointDir(checkpoint_dir, job_id));
  auto* refs = status->mutable_checkpoints();
  const int before = refs->size();
  for (int i = refs->size() - 1; i >= 0; --i) {
    // By the job's own folder names, so a checkpoint root named another way
    // since (relative, moved) matches too.
    const std::filesystem::path dir =
        std::filesystem::path(refs->Get(i).manifest_path()).parent_path();
    if (dir.filename() == final_dir.filename() &&
        dir.parent_path().filename() == final_dir.parent_path().filename()) {
      refs->DeleteSubrange(i, 1);
    }
  }
  return refs->size() != before;
}

absl::Status VerifyCheckpointReports(
    const std::vector<v1::StageCheckpointed>& reports) {
  for (const v1::StageCheckpointed& r : reports) {
    // As a manifest beside the file would list it.
    const std::string beside =
        (std::filesystem::path(r.path()).parent_path() / storage::kManifestName)
            .string();
    RETURN_IF_ERROR(storage::VerifyCheckpointFile(beside, ManifestEntry(r)));
  }
  return absl::OkStatus();
}

std::vector<std::string> KeepCheckpoints(v1::JobStatus* status,
                                         v1::CheckpointRef ref, int64_t keep) {
  if (keep <= 0) keep = 3;
  // A checkpoint of the same step (a replay committed it again) replaces
  // the older entry: the same directory holds both.
  auto* list = status->mutable_checkpoints();
  for (int i = list->size() - 1; i >= 0; --i) {
    if (list->Get(i).step() >= ref.step()) list->DeleteSubrange(i, 1);
  }
  *list->Add() = std::move(ref);
  std::vector<std::string> dropped;
  while (list->size() > keep) {
    dropped.push_back(
        std::filesystem::path(list->Get(0).manifest_path()).parent_path());
    list->DeleteSubrange(0, 1);
  }
  return dropped;
}

void RemoveCheckpointDirs(const std::vector<std::string>& dirs) {
  for (const std::string& dir : dirs) {
    std::error_code error;
    std::filesystem::remove_all(dir, error);
    if (error) {
      LogWarning("cannot remove old checkpoint %s: %s", dir, error.message());
    }
  }
}

std::vector<std::string> JobFileDirs(const std::string& checkpoint_dir,
                                     const std::string& id,
                                     const v1::JobStatus& status) {
  std::set<std::string> dirs = {storage::JobCheckpointDir(checkpoint_dir, id)};
  std::vector<std::string> written = {status.model_path()};
  for (const v1::CheckpointRef& c : status.checkpoints())
    written.push_back(c.manifest_path());
  for (const std::string& path : written) {
    // The folder named after the job above the file, and nothing else.
    for (std::filesystem::path p = std::filesystem::path(path).parent_path();
         p.has_relative_path(); p = p.parent_path()) {
      if (p.filename() == id) {
        dirs.insert(p.string());
        break;
      }
    }
  }
  return {dirs.begin(), dirs.end()};
}

std::vector<std::string> UnknownJobDirs(const std::string& checkpoint_dir,
                                        const std::set<std::string>& known) {
  std::vector<std::string> unknown;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(checkpoint_dir, ec), end;
       !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_error;
    if (!absl::StartsWith(name, "job-") || !it->is_directory(type_error) ||
        known.count(name) > 0) {
      continue;
    }
    unknown.push_back(it->path().string());
  }
  std::sort(unknown.begin(), unknown.end());
  return unknown;
}

std::optional<DroppedCheckpoint> DropOldestCheckpoint(v1::JobStatus* status) {
  auto* list = status->mutable_checkpoints();
  if (list->size() < 2) return std::nullopt;
  DroppedCheckpoint dropped{
      list->Get(0).step(),
      std::filesystem::path(list->Get(0).manifest_path()).parent_path()};
  list->DeleteSubrange(0, 1);
  return dropped;
}

namespace {

// The epoch of a stage file's name, or of its write's temporary file
// ("<name>.tmp.<pid>", storage/file_io.h); nullopt for any other name.
std::optional<int64_t> StageFileEpoch(absl::string_view name) {
  if (const size_t tmp = name.rfind(".tmp."); tmp != absl::string_view::npos) {
    name = name.substr(0, tmp);
  }
  std::optional<storage::StageFileId> id = storage::ParseStageFileName(name);
  if (!id) return std::nullopt;
  return id->epoch;
}

int64_t RemoveStaleFilesIn(const std::filesystem::path& dir, int64_t epoch,
                           bool remove_empty) {
  std::error_code error;
  // A manifest, or a directory that cannot be read (an unanswered stat on a
  // shared volume is no proof of a missing manifest), is left alone.
  const bool committed =
      std::filesystem::exists(dir / storage::kManifestName, error);
  if (committed || error) return 0;
  int64_t removed = 0;
  // The spec of a commit whose manifest was removed (superseded): it
  // would keep the folder.
  std::error_code spec_error;
  std::filesystem::remove(dir / storage::kJobSpecName, spec_error);
  std::filesystem::directory_iterator it(dir, error), end;
  for (; !error && it != end; it.increment(error)) {
    const std::optional<int64_t> of =
        StageFileEpoch(it->path().filename().native());
    std::error_code kind;
    if (!of || *of >= epoch || !it->is_regular_file(kind)) continue;
    std::error_code gone;
    if (std::filesystem::remove(it->path(), gone)) ++removed;
  }
  if (error) {
    LogWarning("cannot clear stale files of %s: %s", dir.native(),
               error.message());
  }
  // Only an empty directory goes, and only when the job has ended: at an
  // epoch's start a stage of the new epoch may have just made it.
  if (remove_empty && std::filesystem::is_empty(dir, error)) {
    std::filesystem::remove(dir, error);
  }
  return removed;
}

}  // namespace

int64_t RemoveStaleStageFiles(const std::string& checkpoint_dir,
                              const std::string& job_id, int64_t epoch,
                              bool remove_empty_dirs) {
  const std::filesystem::path job_dir =
      storage::JobCheckpointDir(checkpoint_dir, job_id);
  const std::filesystem::path final_dir =
      storage::FinalParametersDir(job_dir.native());
  std::error_code error;
  int64_t removed = 0;
  std::filesystem::directory_iterator it(job_dir, error), end;
  for (; !error && it != end; it.increment(error)) {
    const std::filesystem::path& path = it->path();
    std::error_code kind;
    if (!it->is_directory(kind)) continue;
    if (path == final_dir ||
        storage::ParseCheckpointStepDirName(path.filename().native())) {
      removed += RemoveStaleFilesIn(path, epoch, remove_empty_dirs);
    }
  }
  return removed;
}

RestorePoint CheckRestorePoint(
    const std::vector<v1::CheckpointRef>& committed) {
  RestorePoint point;
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    absl::StatusOr<v1::CheckpointManifest> manifest =
        storage::ReadVerifiedManifest(it->manifest_path());
    if (manifest.ok() && manifest->step() == it->step()) {
      point.chosen = *it;
      break;
    }
    point.unusable.emplace_back(
        *it, manifest.ok() ? absl::DataLossError(absl::StrCat(
                                 it->manifest_path(), " is of step ",
                                 manifest->step(), ", not ", it->step()))
                           : manifest.status());
  }
  return point;
}

int64_t DropUnusable(const std::string& job_id, v1::JobStatus* status,
                     const RestorePoint& point) {
  int64_t dropped = 0;
  auto* list = status->mutable_checkpoints();
  for (const auto& [ref, why] : point.unusable) {
    for (int i = list->size() - 1; i >= 0; --i) {
      if (list->Get(i).step() != ref.step() ||
          list->Get(i).manifest_path() != ref.manifest_path()) {
        continue;
      }
      LogError(
          "job %s: checkpoint of step %d is unusable, falling back to "
          "the one before: %s",
          job_id, ref.step(), why.ToString());
      list->DeleteSubrange(i, 1);
      ++dropped;
    }
  }
  return dropped;
}

}  // namespace gpipe::controller
