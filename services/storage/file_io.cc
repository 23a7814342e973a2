#include "services/storage/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"

namespace gpipe::storage {
namespace {

// Linux moves at most this much per read() or write() call anyway.
constexpr size_t kMaxChunk = size_t{1} << 30;

absl::Status ErrnoError(int error, std::string_view action,
                        std::string_view path) {
  return absl::ErrnoToStatus(
      error, absl::StrCat("cannot ", AsAbsl(action), " ", AsAbsl(path)));
}

}  // namespace

ScopedFd& ScopedFd::operator=(ScopedFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ScopedFd::Close() {
  // Linux releases the descriptor even when close() fails, so never retry.
  const int fd = std::exchange(fd_, -1);
  if (fd >= 0 && ::close(fd) != 0) {
    return absl::ErrnoToStatus(errno, "close failed");
  }
  return absl::OkStatus();
}

absl::StatusOr<ScopedFd> OpenForRead(const std::string& path, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO with no writer would wait forever, deaf to
  // SIGTERM, before fstat could refuse it. Reads of a regular file ignore it.
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return ErrnoError(errno, "open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "stat", path);
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a directory, not a file"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file (a device, FIFO or socket)"));
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  uint64_t size = 0;
  ASSIGN_OR_RETURN(ScopedFd fd, OpenForRead(path, &size));
  std::string bytes(static_cast<size_t>(size), '\0');
  RETURN_IF_ERROR(ReadAt(fd, path, 0, bytes.data(), bytes.size()));
  return bytes;
}

absl::Status ReadAt(const ScopedFd& fd, const std::string& path,
                    uint64_t offset, void* dst, size_t n) {
  char* out = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd.get(), out, std::min(n, kMaxChunk),
                                static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "read", path);
    }
    if (got == 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": file ends at byte ", offset, ", ", n,
                       " bytes short (it changed while being read?)"));
    }
    out += got;
    offset += got;
    n -= got;
  }
  return absl::OkStatus();
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(
    const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty path");
  std::string temp_path = absl::StrCat(path, ".tmp.", ::getpid());
  // O_TRUNC rather than O_EXCL: a crash can leave a stale file under this
  // name, and in a container our pid is often the same on the next run.
  ScopedFd fd(::open(temp_path.c_str(),
                     O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  // Named by the file asked for: the temporary name told a user of `-o
  // missing/t.json` of a t.json.tmp.PID they never asked for. But where
  // only the temporary's longer name is too long, that is the one to name.
  if (fd.get() < 0) {
    const int error = errno;
    return ErrnoError(error, "create",
                      error == ENAMETOOLONG ? temp_path : path);
  }
  return AtomicFileWriter(path, std::move(temp_path), std::move(fd));
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& o) noexcept
    : path_(std::move(o.path_)),
      temp_path_(std::move(o.temp_path_)),
      fd_(std::move(o.fd_)),
      done_(std::exchange(o.done_, true)) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (done_) return;
  fd_.Close().IgnoreError();
  ::unlink(temp_path_.c_str());
}

absl::Status AtomicFileWriter::Append(const void* data, size_t n) {
  if (done_) return absl::FailedPreconditionError("writer already committed");
  const char* in = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd_.get(), in, std::min(n, kMaxChunk));
    if (put < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write", temp_path_);
    }
    in += put;
    n -= put;
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (done_) return absl::FailedPreconditionError("writer already committed");
  // The data must be on disk before the rename makes it visible; otherwise
  // a crash can leave the final name pointing at an empty or partial file.
  if (::fsync(fd_.get()) != 0) return ErrnoError(errno, "fsync", temp_path_);
  if (absl::Status s = fd_.Close(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(temp_path_, ": ", s.message()));
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return ErrnoError(errno, "rename over", path_);
  }
  done_ = true;
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (dir.empty()) dir = std::filesystem::path(".");
  ScopedFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0) {
    return ErrnoError(errno, "open directory", dir.native());
  }
  if (::fsync(dir_fd.get()) != 0) {
    return ErrnoError(errno, "fsync", dir.native());
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 std::string_view data) {
  ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
  RETURN_IF_ERROR(writer.Append(data));
  return writer.Commit();
}

absl::Status CheckWritableDirectory(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create the directory ", dir, ": ", error.message()));
  }
  const std::string probe =
      (std::filesystem::path(dir) / ".gpipe-write-probe").string();
  absl::Status written = WriteFileAtomically(probe, "probe");
  std::filesystem::remove(probe, error);
  if (absl::IsResourceExhausted(written)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(dir, " is full: ", written.message()));
  }
  if (!written.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is not writable: ", written.message()));
  }
  return absl::OkStatus();
}

}  // namespace gpipe::storage
