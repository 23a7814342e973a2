#include "services/storage/manifest.h"

#include <filesystem>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/storage/file_io.h"
#include "services/storage/safetensors_header.h"
#include "services/storage/sha256.h"

namespace gpipe::storage {
namespace {

namespace v1 = gpipe::v1;

bool IsHexDigest(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::Status CheckManifest(const std::string& path,
                           const v1::CheckpointManifest& m) {
  if (m.step() < 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": step is negative (", m.step(), ")"));
  }
  if (m.files().empty()) {
    return absl::DataLossError(absl::StrCat(path, ": lists no files"));
  }
  for (int i = 0; i < m.files_size(); ++i) {
    const v1::CheckpointFile& f = m.files(i);
    const std::filesystem::path p(f.path());
    bool escapes = f.path().empty() || p.is_absolute();
    for (const auto& part : p) escapes = escapes || part == "..";
    if (escapes) {
      return absl::DataLossError(absl::StrCat(
          path, ": files[", i, "].path \"", f.path(),
          "\" is not a plain path inside the checkpoint directory"));
    }
    if (!IsHexDigest(f.sha256())) {
      return absl::DataLossError(absl::StrCat(
          path, ": files[", i, "].sha256 is not 64 lowercase hex digits"));
    }
    if (f.bytes() < 0 || f.layer_begin() < 0 ||
        f.layer_end() < f.layer_begin()) {
      return absl::DataLossError(
          absl::StrCat(path, ": files[", i, "] has a negative size or range"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteManifest(const std::string& path,
                           const v1::CheckpointManifest& manifest) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  if (auto s =
          google::protobuf::util::MessageToJsonString(manifest, &json, options);
      !s.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot encode the manifest: ", s.ToString()));
  }
  ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
  RETURN_IF_ERROR(writer.Append(json));
  return writer.Commit();
}

absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& path) {
  uint64_t size = 0;
  ASSIGN_OR_RETURN(ScopedFd fd, OpenForRead(path, &size));
  if (size > (16u << 20)) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", size, " bytes is too large for a manifest"));
  }
  std::string json(size, '\0');
  RETURN_IF_ERROR(ReadAt(fd, path, 0, json.data(), size));
  v1::CheckpointManifest manifest;
  if (auto s = google::protobuf::util::JsonStringToMessage(json, &manifest);
      !s.ok()) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a checkpoint manifest (", s.ToString(), ")"));
  }
  RETURN_IF_ERROR(CheckManifest(path, manifest));
  return manifest;
}

std::string ManifestFilePath(const std::string& manifest_path,
                             const v1::CheckpointFile& file) {
  return (std::filesystem::path(manifest_path).parent_path() / file.path())
      .string();
}

absl::Status VerifyCheckpointFile(const std::string& manifest_path,
                                  const v1::CheckpointFile& file) {
  const std::string path = ManifestFilePath(manifest_path, file);
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  if (error) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint file ", path, " is unreadable: ", error.message()));
  }
  if (size != static_cast<uintmax_t>(file.bytes())) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " has ",
                                            size, " bytes, its manifest says ",
                                            file.bytes()));
  }
  absl::StatusOr<std::string> digest = Sha256File(path);
  if (!digest.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint file ", path,
                     " is unreadable: ", digest.status().message()));
  }
  if (*digest != file.sha256()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path,
                                            " does not match its manifest's "
                                            "sha256 (corrupt)"));
  }
  return absl::OkStatus();
}

absl::Status CheckFileStep(std::string_view what,
                           const std::map<std::string, std::string>& metadata,
                           int64_t manifest_step) {
  const auto it = metadata.find("step");
  int64_t step = 0;
  if (it != metadata.end() &&
      (!absl::SimpleAtoi(it->second, &step) || step != manifest_step)) {
    return absl::DataLossError(absl::StrCat(
        AsAbsl(what), " is of step ", it->second, ", its manifest's is ",
        manifest_step, " (a file of another checkpoint?)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CheckpointManifest> ReadVerifiedManifest(
    const std::string& path) {
  ASSIGN_OR_RETURN(v1::CheckpointManifest manifest, ReadManifest(path));
  for (const v1::CheckpointFile& file : manifest.files()) {
    RETURN_IF_ERROR(VerifyCheckpointFile(path, file));
    if (!absl::EndsWith(file.path(), ".safetensors")) continue;
    // Its own step, from its header: a file of another checkpoint in its
    // place, with the manifest's digest made to match, is caught here, so
    // the controller falls back to the checkpoint before instead of
    // handing it to stages that would each refuse it.
    // A header that does not parse is left to the stage that loads the
    // file, which refuses it: its digest is the one its writer recorded.
    const std::string file_path = ManifestFilePath(path, file);
    uint64_t size = 0;
    absl::StatusOr<ScopedFd> fd = OpenForRead(file_path, &size);
    if (!fd.ok()) return fd.status();
    const absl::StatusOr<std::string> json =
        ReadHeaderJson(*fd, file_path, size);
    if (!json.ok()) continue;
    const absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(
        *json, size - kHeaderLengthBytes - json->size(), file_path);
    if (!header.ok()) continue;
    RETURN_IF_ERROR(
        CheckFileStep(file_path, header->metadata, manifest.step()));
  }
  return manifest;
}

}  // namespace gpipe::storage
