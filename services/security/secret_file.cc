#include "services/security/secret_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gpipe::security {

absl::StatusOr<std::string> ReadSecretFile(const std::string& flag,
                                           const std::string& path) {
  const std::string what = absl::StrCat("--", flag, "=", path);
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " is empty: give the path of a file"));
  }
  // O_NONBLOCK: a FIFO is refused below instead of waited on (the wait
  // ignored SIGTERM).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(what, ": no such file"));
    }
    if (err == EACCES) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, ": not readable by this user"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot open: ", std::strerror(err)));
  }
  std::string data;
  absl::Status status = [&]() -> absl::Status {
    struct stat st;
    if (fstat(fd, &st) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": cannot stat: ", std::strerror(errno)));
    }
    if (S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": is a directory, not a file"));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": not a regular file (a device, FIFO or socket)"));
    }
    char buffer[4096];
    for (;;) {
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": cannot read: ", std::strerror(errno)));
      }
      if (n == 0) break;
      data.append(buffer, static_cast<size_t>(n));
      if (data.size() > kMaxSecretFileBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": larger than ", kMaxSecretFileBytes,
            " bytes; is it really a certificate, key or token file?"));
      }
    }
    if (data.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the file is empty"));
    }
    return absl::OkStatus();
  }();
  close(fd);
  if (!status.ok()) return status;
  return data;
}

}  // namespace gpipe::security
