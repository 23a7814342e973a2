// POSIX file plumbing for storage: an owned descriptor, exact positioned
// reads, and a writer that replaces a file atomically.
#ifndef GPIPE_SERVICES_STORAGE_FILE_IO_H_
#define GPIPE_SERVICES_STORAGE_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpipe::storage {

// Closes the descriptor it owns.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& o) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();

  int get() const { return fd_; }
  // Closes now and reports the error a deferred write may surface there.
  absl::Status Close();

 private:
  int fd_ = -1;
};

// Opens `path` for reading; NotFound, PermissionDenied etc. from errno, and
// InvalidArgument when it is not a regular file (a directory, a device such
// as /dev/zero, a FIFO: never blocks on one). Sets *size to its length.
absl::StatusOr<ScopedFd> OpenForRead(const std::string& path, uint64_t* size);

// Reads exactly `n` bytes at `offset`; DataLoss naming `path` when the file
// ends first (it shrank since its size was taken).
absl::Status ReadAt(const ScopedFd& fd, const std::string& path,
                    uint64_t offset, void* dst, size_t n);

// The whole of `path` (OpenForRead's errors, then ReadAt's).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Replaces `path` so that no reader, and no crash, ever sees it half
// written: data goes to "<path>.tmp.<pid>", which is fsynced, renamed over
// `path`, and then the directory is fsynced so the rename is durable too.
// Dropped without Commit(), the writer removes its temporary file. Two
// writers of one path in one process would share the temporary name, so
// callers serialize them.
class AtomicFileWriter {
 public:
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& path);

  AtomicFileWriter(AtomicFileWriter&& o) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status Append(const void* data, size_t n);
  absl::Status Append(std::string_view data) {
    return Append(data.data(), data.size());
  }
  absl::Status Commit();

  const std::string& temp_path() const { return temp_path_; }

 private:
  AtomicFileWriter(std::string path, std::string temp_path, ScopedFd fd)
      : path_(std::move(path)),
        temp_path_(std::move(temp_path)),
        fd_(std::move(fd)) {}

  std::string path_;
  std::string temp_path_;
  ScopedFd fd_;
  bool done_ = false;  // committed, or moved from: nothing to clean up
};

// Creates `dir` where missing and writes, syncs and removes a file in it:
// a directory a service cannot write (read-only, not its owner's) is found
// when it starts, not after a job has trained up to its first checkpoint.
// The error names the directory and errno's reason: ResourceExhausted for a
// full one (no space, or quota), FailedPrecondition otherwise.
absl::Status CheckWritableDirectory(const std::string& dir);

// `data` as the whole of `path`, through an AtomicFileWriter.
absl::Status WriteFileAtomically(const std::string& path,
                                 std::string_view data);

}  // namespace gpipe::storage

#endif  // GPIPE_SERVICES_STORAGE_FILE_IO_H_
