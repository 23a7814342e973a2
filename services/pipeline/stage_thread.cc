#include "services/pipeline/stage_thread.h"

#include <exception>

#include "services/tensor/threads.h"

namespace gpipe {

StageThread::StageThread(int compute_threads)
    : thread_([this, compute_threads] { Loop(compute_threads); }) {}

StageThread::~StageThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::future<void> StageThread::Post(std::function<void()> work) {
  // An exception ends the process here as it would on the caller's thread
  // (a bad_alloc as "out of memory", exit 3: ExplainOutOfMemory). Kept in
  // the future instead, it left the stage's links open, and its
  // neighbours waited on them for good: `gpipectl train --stages 2` hung
  // where --stages 1 said it ran out of memory.
  std::packaged_task<void()> task([work = std::move(work)] {
    try {
      work();
    } catch (...) {
      std::terminate();
    }
  });
  std::future<void> done = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return done;
}

void StageThread::Loop(int compute_threads) {
  SetComputeThreads(compute_threads);
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace gpipe
