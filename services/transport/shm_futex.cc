#include "services/transport/shm_futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace gpipe {
namespace {

// std::atomic<uint32_t> has the size and representation of the word the
// kernel compares (shm_segment.h asserts the size).
uint32_t* Word(std::atomic<uint32_t>* word) {
  return reinterpret_cast<uint32_t*>(word);
}

}  // namespace

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               std::chrono::microseconds timeout) {
  const int64_t us = timeout.count();
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(us / 1000000);
  ts.tv_nsec = static_cast<long>((us % 1000000) * 1000);
  // Shared (not FUTEX_PRIVATE_FLAG): the peer sleeps on the same page.
  syscall(SYS_futex, Word(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, Word(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace gpipe
