#include "controller/stage_file_transfers.h"

#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/storage/file_io.h"
#include "services/storage/manifest.h"
#include "services/storage/sha256.h"

namespace gpipe::controller {

namespace v1 = gpipe::v1;

// Reads `size` bytes of `fd` in chunks of `chunk_bytes`, handing each to
// `send` (false: the client is gone, and `gone()` is returned); returns the
// sha256 of what was read.
absl::StatusOr<std::string> SendChunks(
    const storage::ScopedFd& fd, const std::string& path, uint64_t size,
    int64_t chunk_bytes, absl::FunctionRef<bool(std::string&)> send,
    absl::FunctionRef<absl::Status()> gone) {
  storage::Sha256 digest;
  std::string buffer;
  for (uint64_t offset = 0; offset < size;) {
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>(static_cast<uint64_t>(chunk_bytes), size - offset));
    buffer.resize(n);
    RETURN_IF_ERROR(storage::ReadAt(fd, path, offset, buffer.data(), n));
    digest.Update(buffer);
    offset += n;
    if (!send(buffer)) return gone();
  }
  return digest.Finish();
}

class StageFileTransfers::Slot {
 public:
  static absl::StatusOr<Slot> Take(StageFileTransfers& t) {
    absl::MutexLock lock(&t.mu_);
    auto free = [&t]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu_) {
      return t.active_ < t.options_.max_concurrent;
    };
    if (!t.mu_.AwaitWithTimeout(absl::Condition(&free), t.options_.slot_wait)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the controller is busy with ", t.options_.max_concurrent,
          " stage file transfers; try again"));
    }
    ++t.active_;
    return Slot(&t);
  }
  Slot(Slot&& o) noexcept : t_(std::exchange(o.t_, nullptr)) {}
  Slot& operator=(Slot&&) = delete;
  ~Slot() {
    if (t_ == nullptr) return;
    absl::MutexLock lock(&t_->mu_);
    --t_->active_;
  }

 private:
  explicit Slot(StageFileTransfers* t) : t_(t) {}
  StageFileTransfers* t_;
};

class StageFileTransfers::Claim {
 public:
  Claim(StageFileTransfers& t, std::string path)
      : t_(t), path_(std::move(path)) {}
  // False when an upload of the same file is under way.
  bool Take() {
    absl::MutexLock lock(&t_.mu_);
    taken_ = t_.receiving_.insert(path_).second;
    return taken_;
  }
  ~Claim() {
    if (!taken_) return;
    absl::MutexLock lock(&t_.mu_);
    t_.receiving_.erase(path_);
  }

 private:
  StageFileTransfers& t_;
  const std::string path_;
  bool taken_ = false;
};

namespace {

// A failed write on the controller's disk, said as the controller's.
absl::Status DiskError(const absl::Status& s) {
  return absl::Status(
      s.code(),
      absl::StrCat("the controller's checkpoint store: ", s.message()));
}

}  // namespace

StageFileTransfers::StageFileTransfers(TransferOptions options)
    : options_(std::move(options)) {}

int StageFileTransfers::active() {
  absl::MutexLock lock(&mu_);
  return active_;
}

absl::StatusOr<v1::UploadStageFileResponse> StageFileTransfers::Receive(
    absl::FunctionRef<bool(v1::UploadStageFileRequest*)> read,
    absl::FunctionRef<absl::StatusOr<std::string>(const v1::StageFileHeader&)>
        destination) {
  v1::UploadStageFileRequest message;
  if (!read(&message)) {
    return absl::AbortedError("the upload ended before its header");
  }
  if (!message.has_header()) {
    return absl::InvalidArgumentError("an upload must start with its header");
  }
  const v1::StageFileHeader header = message.header();
  if (header.bytes() <= 0 || header.bytes() > options_.max_file_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an upload of ", header.bytes(), " bytes (the controller takes 1 to ",
        options_.max_file_bytes, ")"));
  }
  ASSIGN_OR_RETURN(const std::string path, destination(header));
  ASSIGN_OR_RETURN(Slot slot, Slot::Take(*this));
  Claim claim(*this, path);
  if (!claim.Take()) {
    return absl::AbortedError(
        absl::StrCat("an upload of ", path, " is already under way"));
  }
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(),
                                      error);
  if (error) {
    return DiskError(absl::InternalError(absl::StrCat(
        "cannot create the directory of ", path, ": ", error.message())));
  }
  // Dropped before Commit, the writer removes its temporary file: an upload
  // cut short leaves nothing under any name a reader looks at.
  absl::StatusOr<storage::AtomicFileWriter> writer =
      storage::AtomicFileWriter::Create(path);
  if (!writer.ok()) return DiskError(writer.status());
  storage::Sha256 digest;
  int64_t received = 0;
  std::string sent_digest;
  while (read(&message)) {
    if (message.has_header()) {
      return absl::InvalidArgumentError("an upload has one header");
    }
    if (message.kind_case() == v1::UploadStageFileRequest::kSha256) {
      sent_digest = message.sha256();
      if (read(&message)) {
        return absl::InvalidArgumentError(
            "an upload ends with its sha256; more followed");
      }
      break;
    }
    const std::string& chunk = message.chunk();
    if (static_cast<int64_t>(chunk.size()) > header.bytes() - received) {
      return absl::InvalidArgumentError(
          absl::StrCat("the upload of ", path, " has more than the ",
                       header.bytes(), " bytes its header said"));
    }
    if (absl::Status s = writer->Append(chunk); !s.ok()) return DiskError(s);
    digest.Update(chunk);
    received += static_cast<int64_t>(chunk.size());
  }
  if (sent_digest.empty()) {
    return absl::AbortedError(absl::StrCat("the upload of ", path,
                                           " ended after ", received, " of ",
                                           header.bytes(), " bytes"));
  }
  if (received != header.bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the upload of ", path, " has ", received,
                     " bytes; its header said ", header.bytes()));
  }
  const std::string sha256 = digest.Finish();
  if (sha256 != sent_digest) {
    return absl::DataLossError(absl::StrCat("the upload of ", path,
                                            " has sha256 ", sha256,
                                            "; the stage sent ", sent_digest));
  }
  if (absl::Status s = writer->Commit(); !s.ok()) return DiskError(s);
  v1::UploadStageFileResponse response;
  response.set_path(path);
  response.set_sha256(sha256);
  response.set_bytes(received);
  return response;
}

absl::Status StageFileTransfers::Send(
    const std::string& manifest_path, int64_t layer_begin, int64_t layer_end,
    absl::FunctionRef<bool(const v1::FetchCheckpointResponse&)> write) {
  ASSIGN_OR_RETURN(v1::CheckpointManifest manifest,
                   storage::ReadManifest(manifest_path));
  ASSIGN_OR_RETURN(Slot slot, Slot::Take(*this));
  const auto gone = [] {
    return absl::CancelledError("the stage stopped fetching");
  };
  v1::FetchCheckpointResponse out;
  *out.mutable_manifest() = manifest;
  if (!write(out)) return gone();
  for (const v1::CheckpointFile& file : manifest.files()) {
    if (file.layer_end() <= layer_begin || file.layer_begin() >= layer_end) {
      continue;
    }
    const std::string path = storage::ManifestFilePath(manifest_path, file);
    uint64_t size = 0;
    ASSIGN_OR_RETURN(storage::ScopedFd fd, storage::OpenForRead(path, &size));
    if (size != static_cast<uint64_t>(file.bytes())) {
      return absl::DataLossError(absl::StrCat(
          path, " has ", size, " bytes; its manifest says ", file.bytes()));
    }
    *out.mutable_file() = file;
    if (!write(out)) return gone();
    ASSIGN_OR_RETURN(const std::string sha,
                     SendChunks(
                         fd, path, size, options_.chunk_bytes,
                         [&](std::string& chunk) {
                           out.mutable_chunk()->swap(chunk);
                           const bool ok = write(out);
                           out.mutable_chunk()->swap(chunk);
                           return ok;
                         },
                         gone));
    if (sha != file.sha256()) {
      return absl::DataLossError(
          absl::StrCat(path, " no longer matches its manifest's sha256"));
    }
  }
  return absl::OkStatus();
}

absl::Status StageFileTransfers::SendFiles(
    const std::vector<FileToSend>& files,
    absl::FunctionRef<bool(const v1::FetchModelResponse&)> write) {
  ASSIGN_OR_RETURN(Slot slot, Slot::Take(*this));
  const auto gone = [] {
    return absl::CancelledError("the client stopped fetching");
  };
  v1::FetchModelResponse out;
  for (const FileToSend& file : files) {
    uint64_t size = 0;
    ASSIGN_OR_RETURN(storage::ScopedFd fd,
                     storage::OpenForRead(file.path, &size));
    out.mutable_header()->set_name(file.name);
    out.mutable_header()->set_bytes(static_cast<int64_t>(size));
    if (!write(out)) return gone();
    ASSIGN_OR_RETURN(const std::string sha,
                     SendChunks(
                         fd, file.path, size, options_.chunk_bytes,
                         [&](std::string& chunk) {
                           out.mutable_chunk()->swap(chunk);
                           const bool ok = write(out);
                           out.mutable_chunk()->swap(chunk);
                           return ok;
                         },
                         gone));
    if (!file.sha256.empty() && sha != file.sha256) {
      return absl::DataLossError(absl::StrCat(
          file.path,
          " no longer matches the sha256 recorded when it was written"));
    }
    out.set_sha256(sha);
    if (!write(out)) return gone();
  }
  return absl::OkStatus();
}

}  // namespace gpipe::controller
