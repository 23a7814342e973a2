#include "services/transport/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "services/transport/data_plane.h"

namespace gpipe {
namespace {

constexpr uint64_t kMagic = 0x67706970'65736d31;  // "gpipesm1"

// The header at the start of the segment; both sides touch it only through
// atomics, as it is shared between processes.
struct Header {
  std::atomic<uint64_t> magic;
  std::atomic<uint64_t> nonce;
  std::atomic<uint64_t> answer_nonce;
  std::atomic<uint64_t> ring_bytes;
};
// The queues follow the nonces in the header page; a fresh memfd is all
// zeros, which is both queues empty.
struct ControlArea {
  Header header;
  ShmQueues queues[2];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(ControlArea) <= kShmHeaderBytes);

Header* HeaderOf(char* base) { return reinterpret_cast<Header*>(base); }

std::string Errno(const char* what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

}  // namespace

int64_t ShmRingFitting(int64_t room, int64_t most) {
  if (room < ShmSegmentBytes(kMinShmRingBytes) || most < kMinShmRingBytes)
    return 0;
  int64_t ring = kMinShmRingBytes;
  while (ring * 2 <= most && ShmSegmentBytes(ring * 2) <= room) ring *= 2;
  return ring;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(
    int64_t ring_bytes, uint64_t nonce) {
  const int64_t bytes = ShmSegmentBytes(ring_bytes);
  const int fd =
      memfd_create("gpipe-stage-link", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return absl::UnavailableError(Errno("shared memory: memfd_create"));
  if (ftruncate(fd, bytes) != 0) {
    const std::string why = Errno("shared memory: ftruncate");
    close(fd);
    return absl::ResourceExhaustedError(why);
  }
  // Sealed at its size: neither side can shrink the file under the other's
  // mapping (every access past the new end would be SIGBUS, held tensors
  // included), and the seals cannot be lifted.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const std::string why = Errno("shared memory: sealing the segment");
    close(fd);
    return absl::UnavailableError(why);
  }
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    const std::string why = Errno("shared memory: mmap");
    close(fd);
    return absl::ResourceExhaustedError(why);
  }
  Header* h = HeaderOf(static_cast<char*>(p));
  h->nonce.store(nonce);
  h->answer_nonce.store(0);
  h->ring_bytes.store(static_cast<uint64_t>(ring_bytes));
  h->magic.store(kMagic, std::memory_order_release);
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(static_cast<char*>(p), bytes, fd, ring_bytes));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::OpenPeer(
    int64_t pid, int64_t fd, int64_t ring_bytes, uint64_t nonce,
    uint64_t answer_nonce) {
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  const int own = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (own < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open the peer's segment ", path, ": ", std::strerror(errno)));
  }
  const int64_t bytes = ShmSegmentBytes(ring_bytes);
  struct stat st;
  if (fstat(own, &st) != 0 || st.st_size != bytes) {
    close(own);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a segment of ", bytes, " bytes"));
  }
  // An unsealed file could be shrunk by the peer while mapped here.
  const int seals = fcntl(own, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || (seals & F_SEAL_SEAL) == 0) {
    close(own);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not sealed against shrinking"));
  }
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, own, 0);
  close(own);  // the mapping keeps the memory
  if (p == MAP_FAILED) {
    return absl::FailedPreconditionError(
        Errno("shared memory: mmap of the peer's segment"));
  }
  auto segment = std::unique_ptr<ShmSegment>(
      new ShmSegment(static_cast<char*>(p), bytes, -1, ring_bytes));
  Header* h = HeaderOf(segment->base_);
  if (h->magic.load(std::memory_order_acquire) != kMagic ||
      h->nonce.load() != nonce ||
      h->ring_bytes.load() != static_cast<uint64_t>(ring_bytes)) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is not the offered segment (its nonce does not match)"));
  }
  h->answer_nonce.store(answer_nonce, std::memory_order_release);
  return segment;
}

ShmSegment::~ShmSegment() {
  munmap(base_, static_cast<size_t>(bytes_));
  CloseFd();
}

void ShmSegment::CloseFd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

ShmQueues* ShmSegment::queues(Ring r) const {
  return &reinterpret_cast<ControlArea*>(base_)->queues[r];
}

uint64_t ShmSegment::answer_nonce() const {
  return HeaderOf(base_)->answer_nonce.load(std::memory_order_acquire);
}

}  // namespace gpipe
