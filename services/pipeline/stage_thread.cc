#include "services/pipeline/stage_thread.h"

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
  std::packaged_task<void()> task(std::move(work));
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
