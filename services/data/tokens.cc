#include "services/data/tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/data/windows.h"
#include "services/storage/file_io.h"

namespace gpipe {

struct TokenDataset::Mapped {
  std::string path;
  const uint8_t* base = nullptr;  // the mapping; null for an empty one
  size_t length = 0;
  const uint8_t* ids = nullptr;  // after the header
  int64_t count = 0;
  int bytes_per_id = 2;

  ~Mapped() {
    if (base != nullptr) munmap(const_cast<uint8_t*>(base), length);
  }
  int64_t Id(int64_t i) const {
    const uint8_t* p = ids + i * bytes_per_id;
    if (bytes_per_id == 2) return p[0] | (p[1] << 8);
    return static_cast<int64_t>(p[0]) | (static_cast<int64_t>(p[1]) << 8) |
           (static_cast<int64_t>(p[2]) << 16) |
           (static_cast<int64_t>(p[3]) << 24);
  }
};

TokenDataset::~TokenDataset() = default;

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Open(
    const TokenFileOptions& o) {
  if (o.bytes_per_id != 2 && o.bytes_per_id != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ids must be 2 (uint16) or 4 (uint32) bytes, got ", o.bytes_per_id));
  }
  if (o.seq_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len must be positive, got ", o.seq_len));
  }
  if (o.header_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header_bytes must not be negative, got ", o.header_bytes));
  }
  const auto map =
      [&](const std::string& path) -> absl::StatusOr<std::unique_ptr<Mapped>> {
    uint64_t size = 0;
    ASSIGN_OR_RETURN(const storage::ScopedFd fd,
                     storage::OpenForRead(path, &size));
    auto m = std::make_unique<Mapped>();
    m->path = path;
    m->bytes_per_id = o.bytes_per_id;
    m->length = static_cast<size_t>(size);
    if (m->length > 0) {
      void* p = ::mmap(nullptr, m->length, PROT_READ, MAP_PRIVATE, fd.get(), 0);
      if (p == MAP_FAILED) {
        return absl::ErrnoToStatus(errno, absl::StrCat("cannot map ", path));
      }
      m->base = static_cast<const uint8_t*>(p);
    }
    const int64_t length = static_cast<int64_t>(m->length);
    if (length < o.header_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", length, " bytes, shorter than its header (",
                       o.header_bytes, " bytes)"));
    }
    const int64_t body = length - o.header_bytes;
    if (body % o.bytes_per_id != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ", body,
          " bytes after the header are not a whole number of ",
          o.bytes_per_id == 2 ? "uint16" : "uint32", " ids (wrong dtype?)"));
    }
    m->ids = m->base + o.header_bytes;
    m->count = body / o.bytes_per_id;
    return m;
  };

  std::unique_ptr<TokenDataset> d(new TokenDataset());
  d->seq_len_ = o.seq_len;
  if (o.path.empty()) return absl::InvalidArgumentError("path: required");
  ASSIGN_OR_RETURN(std::unique_ptr<Mapped> train, map(o.path));
  const Mapped* train_file = train.get();
  d->files_.push_back(std::move(train));
  if (!o.test_path.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<Mapped> test, map(o.test_path));
    d->train_ = {train_file, 0, train_file->count};
    d->test_ = {test.get(), 0, test->count};
    d->files_.push_back(std::move(test));
  } else {
    double fraction =
        o.test_fraction == 0 ? kDefaultTestFraction : o.test_fraction;
    if (!(fraction > 0 && fraction < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("test_fraction must be in (0, 1), got ", fraction));
    }
    const int64_t n = train_file->count;
    const int64_t test =
        static_cast<int64_t>(std::floor(static_cast<double>(n) * fraction));
    d->train_ = {train_file, 0, n - test};
    d->test_ = {train_file, n - test, test};
  }
  for (auto [name, r] :
       {std::pair{"train", d->train_}, std::pair{"test", d->test_}}) {
    if (r.count < o.seq_len + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.file->path, ": the ", name, " split has ", r.count,
                       " ids, fewer than seq_len + 1 = ", o.seq_len + 1));
    }
  }
  for (const auto& f : d->files_) {
    for (int64_t i = 0; i < f->count; ++i) {
      const int64_t id = f->Id(i);
      if (id > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError(
            absl::StrCat(f->path, ": id ", id, " at position ", i,
                         " does not fit an int32 token id"));
      }
      d->max_id_ = std::max(d->max_id_, id);
    }
  }
  return d;
}

int64_t TokenDataset::size(Split split) const {
  const Range& r = split == Split::kTrain ? train_ : test_;
  return (r.count - 1) / seq_len_;
}

int64_t TokenDataset::Id(Split split, int64_t i) const {
  const Range& r = split == Split::kTrain ? train_ : test_;
  return r.file->Id(r.begin + i);
}

Batch TokenDataset::Gather(Split split,
                           const std::vector<int64_t>& indices) const {
  return GatherWindows(indices, seq_len_,
                       [&](int64_t p) { return Id(split, p); });
}

}  // namespace gpipe
