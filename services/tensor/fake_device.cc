#include "services/tensor/fake_device.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

namespace gpipe {
namespace {

// Address space only: pages are committed as tensors first touch them.
constexpr size_t kReserveBytes = size_t{64} << 30;
constexpr size_t kPageBytes = 4096;

// The arena's range, for the fault report (set once, before any fault).
char* fault_base = nullptr;
size_t fault_size = 0;
struct sigaction previous_segv_action;

void WriteHex(uintptr_t v, char* out) {
  static const char kDigits[] = "0123456789abcdef";
  for (int i = 15; i >= 0; --i, v >>= 4) out[i] = kDigits[v & 15];
}

// Async-signal-safe: names the cause when the fault is in the arena, then
// puts the previous action back, so the repeated fault ends the process as
// it would have (a core, a sanitizer report, gtest's death test).
void ReportFault(int, siginfo_t* info, void*) {
  char* a = static_cast<char*>(info->si_addr);
  if (a >= fault_base && a < fault_base + fault_size) {
    char line[] =
        "fake device: host code touched device memory at 0x0000000000000000 "
        "outside a kernel or copy; on a GPU this reads garbage or crashes "
        "(copy the tensor to the host first: Tensor::To, CopyFrom)\n";
    char* digits = std::strstr(line, "0x") + 2;
    WriteHex(reinterpret_cast<uintptr_t>(a), digits);
    [[maybe_unused]] ssize_t n = write(STDERR_FILENO, line, sizeof line - 1);
  }
  sigaction(SIGSEGV, &previous_segv_action, nullptr);
}

class FakeArena final : public RawMemory {
 public:
  FakeArena() {
    void* p = mmap(nullptr, kReserveBytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "fake device: cannot reserve its arena: %s\n",
                   std::strerror(errno));
      std::abort();
    }
    base_ = static_cast<char*>(p);
    fault_base = base_;
    fault_size = kReserveBytes;
    struct sigaction action = {};
    action.sa_sigaction = ReportFault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previous_segv_action);
  }

  void* Get(size_t bytes) override {
    const size_t size =
        (std::max<size_t>(bytes, 1) + kPageBytes - 1) / kPageBytes * kPageBytes;
    std::lock_guard<std::mutex> lock(mu_);
    // A released block of this size or at most twice it: the caching
    // allocator above asks for a few size classes again and again.
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= 2 * size) {
      char* p = it->second;
      live_[p] = it->first;
      free_.erase(it);
      return p;
    }
    if (used_ + size > kReserveBytes) return nullptr;
    char* p = base_ + used_;
    used_ += size;
    if (open_ > 0) Protect(p, size, PROT_READ | PROT_WRITE);
    live_[p] = size;
    return p;
  }

  void Release(void* p, size_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(static_cast<char*>(p));
    if (it == live_.end()) return;
    free_.emplace(it->second, it->first);
    live_.erase(it);
  }

  Device device() const override { return Device::kCuda; }

  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_++ == 0 && used_ > 0)
      Protect(base_, used_, PROT_READ | PROT_WRITE);
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--open_ == 0 && used_ > 0) Protect(base_, used_, PROT_NONE);
  }

 private:
  static void Protect(char* p, size_t size, int protection) {
    if (mprotect(p, size, protection) != 0) {
      std::fprintf(stderr, "fake device: mprotect: %s\n", std::strerror(errno));
      std::abort();
    }
  }

  char* base_ = nullptr;
  std::mutex mu_;
  size_t used_ = 0;  // bytes handed out from the front of the arena
  int open_ = 0;     // FakeDeviceAccess scopes alive, on all threads
  std::multimap<size_t, char*> free_;
  std::unordered_map<char*, size_t> live_;
};

FakeArena& Arena() {
  static FakeArena* arena = new FakeArena();
  return *arena;
}

}  // namespace

bool FakeDeviceEnabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("GPIPE_FAKE_DEVICE");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  return enabled;
}

RawMemory* FakeDeviceMemory() {
  return FakeDeviceEnabled() ? &Arena() : nullptr;
}

FakeDeviceAccess::FakeDeviceAccess(bool on_device)
    : active_(on_device && FakeDeviceEnabled()) {
  if (active_) Arena().Open();
}

FakeDeviceAccess::~FakeDeviceAccess() {
  if (active_) Arena().Close();
}

}  // namespace gpipe
