#include "services/data/batch_prefetch.h"

#include <system_error>
#include <utility>

namespace gpipe {

BatchPrefetch::BatchPrefetch(const Dataset* dataset, const Sampler* sampler,
                             Part part)
    : dataset_(dataset), sampler_(sampler), part_(part) {}

BatchPrefetch::~BatchPrefetch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

Batch BatchPrefetch::GatherNow(int64_t step) const {
  const std::vector<int64_t> indices = sampler_->Indices(step);
  if (part_ == Part::kTargets) {
    return Batch{Tensor(), dataset_->GatherTargets(Split::kTrain, indices)};
  }
  return dataset_->Gather(Split::kTrain, indices);
}

Batch BatchPrefetch::Take(int64_t step) {
  Batch batch;
  bool ahead = false;
  {
    absl::MutexLock lock(&mu_);
    // A gather of another step in progress would race the one below for
    // nothing but memory; it is short, so let it end.
    mu_.Await(absl::Condition(this, &BatchPrefetch::Idle));
    if (ahead_step_ == step) {
      batch = std::move(ahead_);
      ahead = true;
      ++taken_ahead_;
    }
    ahead_step_ = -1;
    ahead_ = Batch();
  }
  if (!ahead) batch = GatherNow(step);
  {
    absl::MutexLock lock(&mu_);
    if (!thread_.joinable() && !no_thread_) {
      // Without a thread (the process is out of them) every batch is
      // gathered here, as before there was a prefetch.
      try {
        thread_ = std::thread([this] { Run(); });
      } catch (const std::system_error&) {
        no_thread_ = true;
      }
    }
    if (thread_.joinable()) {
      next_ = step + 1;
      busy_ = true;
    }
  }
  return batch;
}

int64_t BatchPrefetch::taken_ahead() const {
  absl::MutexLock lock(&mu_);
  return taken_ahead_;
}

void BatchPrefetch::Run() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(this, &BatchPrefetch::HasWork));
    if (stop_) break;
    const int64_t step = next_;
    next_ = -1;
    mu_.Unlock();
    // A gather that fails here (out of memory) leaves nothing ahead: Take
    // then gathers on the caller's thread, which fails cleanly (a stage's
    // thread turns std::bad_alloc into its status).
    Batch batch;
    bool gathered = true;
    try {
      batch = GatherNow(step);
    } catch (...) {
      gathered = false;
    }
    mu_.Lock();
    if (gathered) {
      ahead_ = std::move(batch);
      ahead_step_ = step;
    }
    busy_ = false;
  }
  busy_ = false;
}

}  // namespace gpipe
