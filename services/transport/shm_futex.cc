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

// Long enough for a peer that is between two posts, short enough not to
// take a shared core from it for long.
constexpr auto kSpin = std::chrono::microseconds(20);

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

void SleepWhile(std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleepers,
                uint32_t expected, std::chrono::microseconds timeout) {
  // A short spin first: a peer that is about to post saves both sides a
  // sleep and a wake.
  const auto spin_end = std::chrono::steady_clock::now() + kSpin;
  while (word->load(std::memory_order_acquire) == expected &&
         std::chrono::steady_clock::now() < spin_end) {
    __builtin_ia32_pause();
  }
  if (word->load() != expected) return;
  sleepers->fetch_add(1);
  if (word->load() == expected) FutexWait(word, expected, timeout);
  sleepers->fetch_sub(1);
}

void Bump(std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleepers,
          uint32_t value) {
  word->store(value);
  if (sleepers->load() != 0) FutexWakeAll(word);
}

}  // namespace gpipe
