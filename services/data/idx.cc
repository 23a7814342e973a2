#include "services/data/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"

namespace gpipe {
namespace {

// Real IDX files hold well under this; a corrupt header must not make us
// reserve gigabytes before we find out the data is not there.
constexpr int64_t kMaxBytes = int64_t{1} << 34;
constexpr int64_t kChunk = int64_t{1} << 20;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

absl::StatusOr<GzFile> Open(const std::string& path) {
  // open() first so that errno reliably says why it failed.
  // O_NONBLOCK: a FIFO is refused below instead of waited on.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  gzFile f = gzdopen(fd, "rb");
  if (f == nullptr) {
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot open ", path, ": out of memory"));
  }
  return GzFile(f);
}

// Reads up to `n` bytes; fewer only at the end of the data. Decompression
// errors (corrupt stream, bad checksum, truncated gzip) are DataLoss.
absl::StatusOr<int64_t> Read(gzFile f, const std::string& path, void* dst,
                             int64_t n) {
  int64_t done = 0;
  while (done < n) {
    const unsigned want = static_cast<unsigned>(std::min(n - done, kChunk));
    const int got = gzread(f, static_cast<char*>(dst) + done, want);
    if (got < 0) {
      int code = 0;
      return absl::DataLossError(absl::StrCat(path, ": ", gzerror(f, &code)));
    }
    if (got == 0) break;
    done += got;
  }
  // zlib reports a gzip stream cut short only through gzerror.
  int code = Z_OK;
  const char* msg = gzerror(f, &code);
  if (code != Z_OK && code != Z_STREAM_END) {
    return absl::DataLossError(absl::StrCat(path, ": ", msg));
  }
  return done;
}

int64_t BigEndian32(const uint8_t* p) {
  return (int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) |
         int64_t{p[3]};
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdx(const std::string& path, int rank) {
  if (rank < 1 || rank > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX rank ", rank, " out of range"));
  }
  ASSIGN_OR_RETURN(GzFile file, Open(path));

  uint8_t magic[4];
  ASSIGN_OR_RETURN(int64_t got, Read(file.get(), path, magic, 4));
  if (got < 4) {
    return absl::DataLossError(absl::StrCat(path, ": truncated IDX header"));
  }
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] != rank) {
    return absl::DataLossError(
        absl::StrCat(path, ": bad IDX magic 0x",
                     absl::Hex(BigEndian32(magic), absl::kZeroPad8),
                     ", want 0x", absl::Hex(0x800 | rank, absl::kZeroPad8)));
  }

  IdxArray array;
  std::vector<uint8_t> header(4 * rank);
  ASSIGN_OR_RETURN(got, Read(file.get(), path, header.data(), header.size()));
  if (got < static_cast<int64_t>(header.size())) {
    return absl::DataLossError(absl::StrCat(path, ": truncated IDX header"));
  }
  int64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = BigEndian32(&header[4 * i]);
    // Divide rather than multiply so a corrupt header cannot overflow.
    if (total != 0 && d > kMaxBytes / total) {
      return absl::DataLossError(
          absl::StrCat(path, ": IDX dimensions too large"));
    }
    total *= d;
    array.dims.push_back(d);
  }

  // Grow as the bytes arrive rather than trusting the header with memory.
  while (static_cast<int64_t>(array.values.size()) < total) {
    const int64_t have = array.values.size();
    const int64_t want = std::min(total - have, std::max(kChunk, have));
    array.values.resize(have + want);
    ASSIGN_OR_RETURN(got,
                     Read(file.get(), path, array.values.data() + have, want));
    if (got < want) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated: header announces ", total,
                       " data bytes, file holds ", have + got));
    }
  }
  uint8_t extra;
  ASSIGN_OR_RETURN(got, Read(file.get(), path, &extra, 1));
  if (got != 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": trailing bytes after ", total, " data bytes"));
  }
  return array;
}

}  // namespace gpipe
