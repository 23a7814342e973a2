#include "services/transport/shm_messages.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "services/tensor/allocator.h"

namespace gpipe {
namespace {

using gpipe::v1::Frame;

// A tensor copied out chunk by chunk is large and usually fresh memory from
// the kernel (glibc maps allocations above 32 MiB anew each time): ask for
// transparent huge pages, so that the copy takes one fault per 2 MiB
// instead of one per 4 KiB (faults are what such a copy mostly costs).
void AdviseHugePages(void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes < 4 * kHuge) return;
  const uintptr_t begin =
      (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) {
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
}

// Lends one received chunk to the tensor the assembler allocates for it,
// when that tensor is exactly the chunk's payload and the channel lets the
// chunk be held; any other allocation goes to the host heap. Tensor storage
// keeps its allocator pointer, so this object lives until the reader and
// every allocation made through it are done.
class ChunkLender final : public Allocator {
 public:
  ChunkLender(std::shared_ptr<ShmChannel> shm, int64_t sequence, char* data,
              int64_t bytes)
      : shm_(std::move(shm)), sequence_(sequence), data_(data), bytes_(bytes) {}

  void* Allocate(size_t bytes) override {
    ++refs_;
    if (!lent_ && bytes > 0 && static_cast<int64_t>(bytes) == bytes_ &&
        shm_->TryHold(bytes_)) {
      lent_ = true;
      return data_;
    }
    void* p = DefaultCpuAllocator()->Allocate(bytes);
    AdviseHugePages(p, bytes);
    return p;
  }
  void Deallocate(void* p, size_t bytes) override {
    if (lent_ && p == data_) {
      shm_->GiveBack(sequence_, bytes_);
    } else {
      DefaultCpuAllocator()->Deallocate(p, bytes);
    }
    Unref();
  }
  Device device() const override { return Device::kCpu; }

  bool lent() const { return lent_; }
  // The reader is done: the chunk goes back now unless a tensor holds it.
  void DoneReading() {
    if (!lent_) shm_->GiveBack(sequence_, 0);
    Unref();
  }

 private:
  void Unref() {
    if (--refs_ == 0) delete this;
  }
  std::shared_ptr<ShmChannel> shm_;
  const int64_t sequence_;
  char* const data_;
  const int64_t bytes_;
  bool lent_ = false;  // set by the reading thread before anyone frees
  std::atomic<int> refs_{1};
};

}  // namespace

absl::Status WriteShmMessage(const Message& m, const std::string& job_id,
                             int64_t epoch, ShmChannel& shm) {
  absl::Status failed;
  const char* src =
      m.tensor.defined() ? static_cast<const char*>(m.tensor.raw()) : nullptr;
  std::string head;
  const bool ok = EncodeFrameFields(
      m, job_id, epoch,
      [&](const Frame& fields, int64_t at, int64_t n) {
        head.clear();
        fields.SerializeToString(&head);
        const int64_t h = static_cast<int64_t>(head.size());
        if (h > kMaxShmHeaderBytes) {
          failed = absl::InvalidArgumentError(
              absl::StrCat("sending ", Describe(m), ": its frame fields take ",
                           h, " bytes, more than ", kMaxShmHeaderBytes));
          return false;
        }
        absl::StatusOr<ShmChunk> c = shm.Reserve(n > 0 ? ShmAlignUp(h) + n : h);
        if (!c.ok()) {
          failed = c.status();
          return false;
        }
        char* dst = shm.Data(*c);
        std::memcpy(dst, head.data(), static_cast<size_t>(h));
        if (n > 0) {
          std::memcpy(dst + ShmAlignUp(h), src + at, static_cast<size_t>(n));
        }
        c->header_bytes = h;
        shm.Post(*c);
        return true;
      },
      shm.chunk_bytes());
  return ok ? absl::OkStatus() : failed;
}

absl::StatusOr<std::optional<Message>> ReadShmChunk(
    const std::shared_ptr<ShmChannel>& shm, const ShmChunk& c,
    FrameAssembler& assembler) {
  const char* bytes = shm->InData(c);
  // A private copy of the fields: the peer cannot change them once parsed.
  const std::string head(bytes, static_cast<size_t>(c.header_bytes));
  Frame f;
  absl::Status bad;
  if (!f.ParseFromString(head)) {
    bad = absl::InvalidArgumentError(
        absl::StrCat("shared memory: the fields of chunk ", c.sequence,
                     " do not parse as gpipe.v1.Frame"));
  } else if (f.has_shm_slot() || !f.payload().empty()) {
    bad = absl::InvalidArgumentError(
        absl::StrCat("shared memory: chunk ", c.sequence,
                     " carries a payload field or a descriptor of its own"));
  }
  const int64_t payload_at =
      c.length > c.header_bytes ? ShmAlignUp(c.header_bytes) : c.length;
  if (bad.ok() && payload_at > c.length) {
    bad = absl::InvalidArgumentError(
        absl::StrCat("shared memory: chunk ", c.sequence, " of ", c.length,
                     " bytes ends inside the padding after its ",
                     c.header_bytes, " header bytes"));
  }
  if (!bad.ok()) {
    shm->GiveBack(c.sequence, 0);
    return bad;
  }
  const int64_t n = c.length - payload_at;
  const char* payload = bytes + payload_at;
  auto* lender =
      new ChunkLender(shm, c.sequence, const_cast<char*>(payload), n);
  absl::StatusOr<std::optional<Message>> m;
  {
    AllocatorScope scope(lender);
    m = assembler.Add(f, n, [&](char* dst) {
      if (dst != payload) std::memcpy(dst, payload, static_cast<size_t>(n));
    });
  }
  lender->DoneReading();
  return m;
}

}  // namespace gpipe
