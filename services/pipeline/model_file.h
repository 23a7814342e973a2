// The metadata of a final model file (model.safetensors), the same whether
// `gpipectl train` or the controller writes it, so the two files of the same
// run are byte for byte equal.
#ifndef GPIPE_SERVICES_PIPELINE_MODEL_FILE_H_
#define GPIPE_SERVICES_PIPELINE_MODEL_FILE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"

namespace gpipe {

// The version of what follows; a reader refuses a file of a later one.
inline constexpr char kModelFormatVersionKey[] = "gpipe.format_version";
inline constexpr char kModelFormatVersion[] = "1";

// {"format": "pt", "gpipe.format_version": "1", "gpipe.job": the spec as
// JSON (with what the data filled in at submit), "gpipe.step": steps}, and
// when the data has them "gpipe.preprocessing" ({"normalize": {"mean": [..],
// "std": [..]}}: what the inputs went through before the first layer) and
// "gpipe.vocabulary" (a text model's byte for each token id, as a JSON list
// of numbers).
std::map<std::string, std::string> ModelFileMetadata(
    const gpipe::v1::JobSpec& spec, int64_t steps);

// What a model file says about itself, read from its header alone.
struct ModelFileInfo {
  gpipe::v1::JobSpec spec;  // the job that trained it, as it ran
  int64_t step = 0;
  std::map<std::string, std::string> metadata;
};

// InvalidArgument for a gpipe.format_version in `metadata` that is not a
// version or is later than this gpipe reads; none is fine (a checkpoint's
// stage file, another tool's weights).
absl::Status CheckModelFormatVersion(
    const std::string& path,
    const std::map<std::string, std::string>& metadata);

// The metadata of the safetensors file at `path`, read from its header
// alone; InvalidArgument "not a safetensors model file: ..." for a file
// that is not one (another format's hint added), the open's own error for
// one that cannot be read.
absl::StatusOr<std::map<std::string, std::string>> ReadMetadata(
    const std::string& path);

// Reads and checks `path`'s header: a safetensors file this product wrote
// (gpipe.job and gpipe.step present), of a format version it knows.
// Errors name the path and what is missing or wrong.
absl::StatusOr<ModelFileInfo> ReadModelFileInfo(const std::string& path);

// The spec of checkpoint directory `dir` (its JOB.json beside the
// manifest, storage::kJobSpecName, checked as ReadModelFileInfo checks a
// model file's); nullopt where there is none (a checkpoint an earlier gpipe
// wrote). Errors name the file.
absl::StatusOr<std::optional<gpipe::v1::JobSpec>> CheckpointJobSpec(
    const std::string& dir);

// The spec that trained what `path` holds, as it ran: a model file's
// gpipe.job (a directory holding one too), or a checkpoint directory's
// JOB.json; nullopt where none is recorded (weights alone, a stage file, an
// older checkpoint, a path that is not there). A record that is there but
// cannot be read is an error naming it: read as none, a corrupt JOB.json
// left a continuing job without the trained vocabulary and normalization.
absl::StatusOr<std::optional<gpipe::v1::JobSpec>> RecordedJobSpec(
    const std::string& path);

// The model file `path` names: `path` itself, or DIR/model.safetensors
// where `path` is a directory that holds one (what `train --out`, `local
// --out` and `fetch` write), so the folder a user was given is enough.
std::string ModelFilePath(const std::string& path);

// The job in `model`'s metadata (a model file, or a directory as
// ModelFilePath takes it) set up to serve the model: its parameters
// loaded strictly from `model` (init_from, no optimizer state), and with
// JOB.json's data and eval settings instead of its own when `job_path` is
// not empty. A checkpoint directory (with MANIFEST.json) serves the same
// way from the spec beside its manifest; one without it (an earlier
// gpipe's) is served by JOB.json's whole spec, and refused without one;
// so is a file of weights that records no job (another tool's, such as
// gpipe.from_torch's), which JOB.json then serves as it would start from
// them.
absl::StatusOr<gpipe::v1::JobSpec> SpecToServe(const std::string& model,
                                               const std::string& job_path);

// An error loading a model SpecToServe set up, in the words of the command
// that serves it: the user wrote no init_from, so no "init_from: " before
// the file's path and no advice to set init_from.strict false (eval,
// predict and generate told users both).
absl::Status ServedModelError(const absl::Status& status);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_MODEL_FILE_H_
