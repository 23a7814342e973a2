// A thread that runs one stage's work items in order. Stages of an
// in-process pipeline each get one, so their OpenMP thread teams and
// thread-local allocators stay put across steps.
#ifndef GPIPE_SERVICES_PIPELINE_STAGE_THREAD_H_
#define GPIPE_SERVICES_PIPELINE_STAGE_THREAD_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace gpipe {

class StageThread {
 public:
  // `compute_threads` is applied on the thread before any work.
  explicit StageThread(int compute_threads);
  ~StageThread();  // finishes queued work, then joins
  StageThread(const StageThread&) = delete;
  StageThread& operator=(const StageThread&) = delete;

  // Queues `work`; the future is ready when it has run. An exception it
  // throws ends the process (std::terminate), as on any other thread.
  std::future<void> Post(std::function<void()> work);

 private:
  void Loop(int compute_threads);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_STAGE_THREAD_H_
