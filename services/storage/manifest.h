// Checkpoint manifests: the controller commits a checkpoint by writing its
// manifest (step, stage files, sha256 of each) atomically; a checkpoint
// without a manifest, or whose files no longer match it, does not exist.
#ifndef GPIPE_SERVICES_STORAGE_MANIFEST_H_
#define GPIPE_SERVICES_STORAGE_MANIFEST_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpipe/v1/checkpoint.pb.h"

namespace gpipe::storage {

inline constexpr char kManifestName[] = "MANIFEST.json";
// Beside a committed manifest: the job's spec as it ran, with what its data
// filled in at submit (protobuf JSON), so a checkpoint says what its ids,
// columns and inputs mean as a model file's gpipe.job does. A file of its
// own, not a manifest field: a gpipe that reads manifests strictly (every
// release before it) still reads these checkpoints. Written after the
// manifest; a checkpoint without one is read as before.
inline constexpr char kJobSpecName[] = "JOB.json";

// Writes `manifest` as JSON to `path`: temporary file, fsync, rename, fsync
// of the directory. A crash leaves the old manifest or the new one.
absl::Status WriteManifest(const std::string& path,
                           const gpipe::v1::CheckpointManifest& manifest);

// Reads a manifest; a missing file is NotFound, a malformed one (bad JSON,
// no files, an absolute or escaping path, a bad digest) DataLoss.
absl::StatusOr<gpipe::v1::CheckpointManifest> ReadManifest(
    const std::string& path);

// The absolute path of `file` of the manifest at `manifest_path`.
std::string ManifestFilePath(const std::string& manifest_path,
                             const gpipe::v1::CheckpointFile& file);

// Checks one file against its manifest entry: size and sha256. DataLoss
// naming the file when it is missing, truncated or altered.
absl::Status VerifyCheckpointFile(const std::string& manifest_path,
                                  const gpipe::v1::CheckpointFile& file);

// DataLoss when a checkpoint file's own "step" (its metadata, as
// SaveStageCheckpoint writes it) is not its manifest's: the file of another
// checkpoint put in its place, with a manifest whose sha256 was made to
// match, would restore a stage a step apart from the others.
absl::Status CheckFileStep(std::string_view what,
                           const std::map<std::string, std::string>& metadata,
                           int64_t manifest_step);

// ReadManifest, then VerifyCheckpointFile and CheckFileStep on every file.
absl::StatusOr<gpipe::v1::CheckpointManifest> ReadVerifiedManifest(
    const std::string& path);

}  // namespace gpipe::storage

#endif  // GPIPE_SERVICES_STORAGE_MANIFEST_H_
