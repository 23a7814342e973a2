// Sleeping on a 32-bit word of a shared mapping until the other process
// changes it: a futex without the private flag works across processes that
// map the same memory. Waits are bounded, so a caller that also watches a
// local flag (a closed link) notices it soon even if a wake was missed.
#ifndef GPIPE_SERVICES_TRANSPORT_SHM_FUTEX_H_
#define GPIPE_SERVICES_TRANSPORT_SHM_FUTEX_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace gpipe {

// Sleeps while `*word` == `expected`, at most `timeout`; returns early on a
// wake, a change of the word or a signal (callers recheck their condition).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               std::chrono::microseconds timeout);
// Wakes every process and thread sleeping on `word`.
void FutexWakeAll(std::atomic<uint32_t>* word);

// The same with a count of sleepers beside the word, so that a side that
// bumps the word makes the system call only when someone may sleep: the
// sleeper counts itself before it rechecks the word, the waker bumps the
// word before it reads the count (both sequentially consistent), so one of
// them always sees the other.
void SleepWhile(std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleepers,
                uint32_t expected, std::chrono::microseconds timeout);
void Bump(std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleepers,
          uint32_t value);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_SHM_FUTEX_H_
