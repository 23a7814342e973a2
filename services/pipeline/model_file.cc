#include "services/pipeline/model_file.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "services/core/status.h"
#include "services/pipeline/data_resolution.h"
#include "services/pipeline/job_spec.h"
#include "services/storage/checkpoint_layout.h"
#include "services/storage/file_io.h"
#include "services/storage/manifest.h"
#include "services/storage/safetensors.h"
#include "services/storage/safetensors_header.h"

namespace gpipe {
namespace {

// Floats as JSON numbers that read back to the same float32.
std::string FloatList(const google::protobuf::RepeatedField<float>& values) {
  return absl::StrCat("[",
                      absl::StrJoin(values, ", ",
                                    [](std::string* out, float v) {
                                      char buf[32];
                                      std::snprintf(buf, sizeof(buf), "%.9g",
                                                    v);
                                      out->append(buf);
                                    }),
                      "]");
}

// A spec recorded with trained parameters (a model file's gpipe.job, a
// checkpoint's JOB.json), as it ran: checked, and its data read only for a
// size an old file left at 0, never with its init_from, which may have
// changed since or be this very file.
absl::StatusOr<gpipe::v1::JobSpec> ParseRecordedSpec(std::string_view json) {
  ASSIGN_OR_RETURN(gpipe::v1::JobSpec spec,
                   ParseJobSpecJson(json, SpecCheck::kJsonOnly));
  const bool had_init = spec.has_init_from();
  const gpipe::v1::InitFrom init = spec.init_from();
  spec.clear_init_from();
  RETURN_IF_ERROR(CheckJobSpec(&spec));
  if (had_init) *spec.mutable_init_from() = init;
  return spec;
}

}  // namespace

std::map<std::string, std::string> ModelFileMetadata(
    const gpipe::v1::JobSpec& spec, int64_t steps) {
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(spec, &json);
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {kModelFormatVersionKey, kModelFormatVersion},
      {"gpipe.job", json},
      {"gpipe.step", absl::StrCat(steps)}};
  const gpipe::v1::DataSpec& data = spec.data();
  if (data.has_normalize()) {
    metadata["gpipe.preprocessing"] = absl::StrCat(
        "{\"normalize\": {\"mean\": ", FloatList(data.normalize().mean()),
        ", \"std\": ", FloatList(data.normalize().std()), "}}");
  }
  if (data.has_text() && !data.text().vocabulary().empty()) {
    const std::string& bytes = data.text().vocabulary();
    metadata["gpipe.vocabulary"] = absl::StrCat(
        "[",
        absl::StrJoin(bytes, ", ",
                      [](std::string* out, char c) {
                        absl::StrAppend(out, static_cast<uint8_t>(c));
                      }),
        "]");
  }
  return metadata;
}

absl::Status CheckModelFormatVersion(
    const std::string& path,
    const std::map<std::string, std::string>& metadata) {
  const auto it = metadata.find(kModelFormatVersionKey);
  if (it == metadata.end()) return absl::OkStatus();
  int64_t version = 0;
  if (!absl::SimpleAtoi(it->second, &version) || version < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", kModelFormatVersionKey, " is \"", it->second, "\""));
  }
  // InvalidArgument, as for any file the job cannot use: a stage that reads
  // it then fails the job for good (worker/executor.cc's Failure), where
  // FailedPrecondition read as a lost link, retried ten times.
  if (version > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": model format version ", version,
        " is newer than this gpipe reads (", kModelFormatVersion, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> ReadMetadata(
    const std::string& path) {
  uint64_t size = 0;
  ASSIGN_OR_RETURN(const storage::ScopedFd fd,
                   storage::OpenForRead(path, &size));
  const auto not_model = [&](const absl::Status& s) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a safetensors model file: ", s.message(),
                     OtherWeightsFormatHint(path)));
  };
  const absl::StatusOr<std::string> json =
      storage::ReadHeaderJson(fd, path, size);
  if (!json.ok()) return not_model(json.status());
  absl::StatusOr<storage::SafetensorsHeader> header =
      storage::ParseSafetensorsHeader(
          *json, size - storage::kHeaderLengthBytes - json->size(), path);
  if (!header.ok()) return not_model(header.status());
  return std::move(header->metadata);
}

namespace {

// gpipe.vocabulary's JSON list of bytes ("[10, 32, 33]") as the bytes, each
// a whole number 0-255, in ascending order (as data.text.vocabulary must
// be); an error names the entry.
absl::StatusOr<std::string> ParseVocabularyList(const std::string& path,
                                                absl::string_view list) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": gpipe.vocabulary: ", why,
                     " (a JSON list of distinct bytes 0-255 in ascending "
                     "order, as gpipe writes it)"));
  };
  list = absl::StripAsciiWhitespace(list);
  if (list.size() < 2 || list.front() != '[' || list.back() != ']') {
    return bad("not a list");
  }
  list = absl::StripAsciiWhitespace(list.substr(1, list.size() - 2));
  std::string bytes;
  if (list.empty()) return bytes;
  int previous = -1;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int value = 0;
    if (!absl::SimpleAtoi(entry, &value) || value < 0 || value > 255) {
      return bad(absl::StrCat("entry ", bytes.size(), " is \"", entry,
                              "\", not a byte"));
    }
    if (value <= previous) {
      return bad(absl::StrCat("entry ", bytes.size(), " (", value,
                              ") is not above the one before it (", previous,
                              ")"));
    }
    previous = value;
    bytes.push_back(static_cast<char>(value));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<ModelFileInfo> ReadModelFileInfo(const std::string& path) {
  ModelFileInfo info;
  ASSIGN_OR_RETURN(info.metadata, ReadMetadata(path));
  const auto get = [&](const char* key) -> const std::string* {
    auto it = info.metadata.find(key);
    return it == info.metadata.end() ? nullptr : &it->second;
  };
  RETURN_IF_ERROR(CheckModelFormatVersion(path, info.metadata));
  const std::string* job = get("gpipe.job");
  const std::string* step = get("gpipe.step");
  if (job == nullptr || step == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": no ",
        job == nullptr && step == nullptr ? "gpipe.job or gpipe.step"
        : job == nullptr                  ? "gpipe.job"
                                          : "gpipe.step",
        " in its metadata: not a model file "
        "gpipe wrote (a checkpoint's stage file? use the job's "
        "model.safetensors; another tool's weights? gpipectl eval takes "
        "them with a job's spec after them: eval FILE JOB.json)"));
  }
  if (!absl::SimpleAtoi(*step, &info.step) || info.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": gpipe.step is \"", *step, "\""));
  }
  absl::StatusOr<gpipe::v1::JobSpec> spec = ParseRecordedSpec(*job);
  if (!spec.ok()) {
    return absl::Status(
        spec.status().code(),
        absl::StrCat(path, ": its gpipe.job: ", spec.status().message()));
  }
  info.spec = *std::move(spec);
  // The vocabulary is written twice, in gpipe.job and as gpipe.vocabulary
  // (which readers without a protobuf parser use, the Python package
  // first). Every reader must map bytes to the same ids: a file whose two
  // records disagree was edited, and is refused rather than decoded one
  // way here and another there. One without the job's record takes the
  // list's.
  if (const std::string* list = get("gpipe.vocabulary"); list != nullptr) {
    ASSIGN_OR_RETURN(const std::string bytes, ParseVocabularyList(path, *list));
    gpipe::v1::DataSpec& data = *info.spec.mutable_data();
    if (!data.has_text()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path,
          ": gpipe.vocabulary is set, but its gpipe.job reads no text: a "
          "text model's vocabulary on another model (the metadata was "
          "edited)"));
    }
    const std::string& recorded = data.text().vocabulary();
    if (recorded.empty()) {
      data.mutable_text()->set_vocabulary(bytes);
    } else if (recorded != bytes) {
      size_t i = 0;
      while (i < recorded.size() && i < bytes.size() &&
             recorded[i] == bytes[i]) {
        ++i;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": gpipe.vocabulary (", bytes.size(),
          " bytes) and gpipe.job's data.text.vocabulary (", recorded.size(),
          " bytes) disagree from token id ", i,
          ": the metadata was edited, and readers would map text to ids "
          "differently"));
    }
  }
  // The normalization too: gpipe.preprocessing is what readers without a
  // protobuf parser apply, gpipe.job's data.normalize what gpipe applies.
  // An edited one was ignored here while other readers took it.
  if (const std::string* pre = get("gpipe.preprocessing"); pre != nullptr) {
    gpipe::v1::DataSpec written;  // {"normalize": {...}} is a DataSpec's JSON
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = false;
    const auto parsed =
        google::protobuf::util::JsonStringToMessage(*pre, &written, options);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path,
          ": gpipe.preprocessing is not {\"normalize\": {\"mean\": "
          "[...], \"std\": [...]}}: ",
          std::string(parsed.message().data(), parsed.message().size())));
    }
    const gpipe::v1::DataSpec& data = info.spec.data();
    const auto same = [](const auto& a, const auto& b) {
      return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
    };
    if (!data.has_normalize() ||
        !same(written.normalize().mean(), data.normalize().mean()) ||
        !same(written.normalize().std(), data.normalize().std())) {
      return absl::InvalidArgumentError(absl::StrCat(
          path,
          ": gpipe.preprocessing and gpipe.job's data.normalize disagree: the "
          "metadata was edited, and readers would normalize the inputs "
          "differently"));
    }
  }
  return info;
}

absl::StatusOr<std::optional<gpipe::v1::JobSpec>> CheckpointJobSpec(
    const std::string& dir) {
  const std::string path =
      (std::filesystem::path(dir) / storage::kJobSpecName).string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  ASSIGN_OR_RETURN(const std::string json, storage::ReadWholeFile(path));
  absl::StatusOr<gpipe::v1::JobSpec> spec = ParseRecordedSpec(json);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        absl::StrCat(path, ": ", spec.status().message()));
  }
  return *std::move(spec);
}

absl::StatusOr<std::optional<gpipe::v1::JobSpec>> RecordedJobSpec(
    const std::string& path) {
  std::error_code ec;
  const std::string model = ModelFilePath(path);
  if (std::filesystem::is_regular_file(model, ec)) {
    // Weights alone (a stage file, another tool's) record no job; a file
    // that cannot be read at all is the weights loader's to name.
    const absl::StatusOr<std::map<std::string, std::string>> metadata =
        ReadMetadata(model);
    if (!metadata.ok() || !metadata->contains("gpipe.job")) {
      return std::nullopt;
    }
    ASSIGN_OR_RETURN(ModelFileInfo info, ReadModelFileInfo(model));
    return std::move(info.spec);
  }
  if (!std::filesystem::exists(
          std::filesystem::path(model) / storage::kManifestName, ec)) {
    return std::nullopt;
  }
  return CheckpointJobSpec(model);
}

std::string ModelFilePath(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return path;
  const std::string inside = storage::MergedModelPath(path);
  return std::filesystem::is_regular_file(inside, ec) ? inside : path;
}

namespace {

// JOB.json's whole spec serving the parameters at `model` (loaded
// strictly, as init_from): for parameters that record no job, a
// checkpoint's of an earlier gpipe (`trained_by_job`: the job that spec
// describes trained them) or another tool's weights.
absl::StatusOr<gpipe::v1::JobSpec> ServeWithJobSpec(const std::string& model,
                                                    const std::string& job_path,
                                                    bool trained_by_job) {
  ASSIGN_OR_RETURN(gpipe::v1::JobSpec spec,
                   LoadJobSpecFile(job_path, SpecCheck::kJsonOnly));
  // The job's own init_from is no part of serving the parameters, but a
  // model file it started from says how the job read its data, and so how
  // the parameters it trained read it. Another tool's weights owe that
  // file nothing: the job's data is read as the job's spec says.
  if (trained_by_job) RETURN_IF_ERROR(AdoptInitFromPreprocessing(&spec));
  gpipe::v1::InitFrom& init = *spec.mutable_init_from();
  init.Clear();
  init.set_path(model);  // a checkpoint's manifest checks every digest
  init.set_strict(true);
  if (absl::Status s = CheckJobSpec(&spec); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(job_path, ": ", s.message()));
  }
  return spec;
}

// `trained` (the spec a model file or checkpoint recorded) set up to serve
// the parameters at `model`: JOB.json's data and eval instead of its own
// when `job_path` is set, read with the model's own preprocessing.
absl::StatusOr<gpipe::v1::JobSpec> ServeTrained(gpipe::v1::JobSpec spec,
                                                const std::string& model,
                                                const std::string& job_path) {
  if (!job_path.empty()) {
    ASSIGN_OR_RETURN(const gpipe::v1::JobSpec job, LoadJobSpecFile(job_path));
    const gpipe::v1::DataSpec trained = spec.data();
    *spec.mutable_data() = job.data();
    *spec.mutable_eval() = job.eval();
    // The model's preprocessing is part of the model: other data is read
    // with the ids, columns and statistics it was trained with, not ones
    // made from that data (another text file's bytes were numbered afresh,
    // and its loss read as 3.99 for a model at 0.65).
    gpipe::v1::DataSpec& data = *spec.mutable_data();
    if (trained.has_normalize()) {
      *data.mutable_normalize() = trained.normalize();
    } else {
      data.clear_normalize();
    }
    if (data.has_csv()) {
      data.mutable_csv()->set_standardize(false);  // normalize, above
      if (trained.has_csv()) {
        *data.mutable_csv()->mutable_feature_columns() =
            trained.csv().feature_columns();
      }
    }
    if (data.has_text() && trained.has_text()) {
      data.mutable_text()->set_vocabulary(trained.text().vocabulary());
    }
  }
  gpipe::v1::InitFrom& init = *spec.mutable_init_from();
  init.Clear();
  init.set_path(model);  // a checkpoint's manifest checks every file's digest
  init.set_strict(true);
  return spec;
}

}  // namespace

absl::StatusOr<gpipe::v1::JobSpec> SpecToServe(const std::string& path,
                                               const std::string& job_path) {
  const std::string model = ModelFilePath(path);
  std::error_code ec;
  const bool checkpoint =
      std::filesystem::is_directory(model, ec) &&
      std::filesystem::exists(
          std::filesystem::path(model) / storage::kManifestName, ec);
  if (checkpoint) {
    // A checkpoint (`fetch JOB --step N`) has its job's spec beside its
    // manifest, and serves as a model file does.
    ASSIGN_OR_RETURN(std::optional<gpipe::v1::JobSpec> recorded,
                     CheckpointJobSpec(model));
    if (recorded.has_value()) {
      return ServeTrained(*std::move(recorded), model, job_path);
    }
    // One written before manifests recorded it: the job's spec says what
    // the model is.
    if (job_path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path,
          ": a checkpoint without its job's spec beside it (JOB.json: one "
          "an earlier gpipe wrote): eval takes it with the job's spec after "
          "it (gpipectl eval ",
          path,
          " JOB.json); predict and generate take a model file (gpipectl "
          "fetch JOB, without --step, once the job has succeeded)"));
    }
    return ServeWithJobSpec(model, job_path, /*trained_by_job=*/true);
  }
  if (std::filesystem::is_directory(model, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": a directory with no model.safetensors in it (name the model "
        "file, or the folder train --out or fetch wrote it into)"));
  }
  // Weights another tool wrote (gpipe.from_torch's, say) record no job:
  // with JOB.json they are served as that job would start from them, so
  // they can be evaluated before any training.
  // Only a file that is one and records no job at all: a model file whose
  // record cannot be read is refused for that, not served as another's.
  if (!job_path.empty() && std::filesystem::is_regular_file(model, ec)) {
    const absl::StatusOr<std::map<std::string, std::string>> metadata =
        ReadMetadata(model);
    // A step without its job is no record either (the message below sent
    // such a file here, and here it was refused again).
    if (metadata.ok() && !metadata->contains("gpipe.job")) {
      RETURN_IF_ERROR(CheckModelFormatVersion(model, *metadata));
      return ServeWithJobSpec(model, job_path, /*trained_by_job=*/false);
    }
  }
  ASSIGN_OR_RETURN(ModelFileInfo info, ReadModelFileInfo(model));
  return ServeTrained(std::move(info.spec), model, job_path);
}

absl::Status ServedModelError(const absl::Status& status) {
  absl::string_view m = status.message();
  for (absl::string_view field :
       {"init_from.optimizer_state: ", "init_from.step: ", "init_from: "}) {
    if (absl::ConsumePrefix(&m, field)) break;
  }
  return absl::Status(
      status.code(),
      absl::StrReplaceAll(
          m, {{" (set init_from.strict false to load what matches)", ""}}));
}

}  // namespace gpipe
