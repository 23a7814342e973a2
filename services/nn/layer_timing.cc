#include "services/nn/layer_timing.h"

#include <algorithm>
#include <thread>

namespace gpipe {
namespace {

// Weight of the newest step in the running estimates: about the last ten
// steps count, so an estimate follows a change within a few steps and one
// noisy step moves it little.
constexpr double kNewest = 0.2;
// Slowdown sleeps are taken in pieces at least this long: sleeping after
// every microsecond layer would cost more in wake-ups than it emulates.
constexpr double kMinSleepSeconds = 1e-3;

}  // namespace

LayerTiming::LayerTiming(int64_t layers, double slowdown)
    : slowdown_(std::max(1.0, slowdown)),
      step_forward_(layers, 0.0),
      step_backward_(layers, 0.0) {}

void LayerTiming::Finished(int64_t local, bool backward, bool record,
                           std::chrono::steady_clock::time_point start) {
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (record) {
    // With a slowdown the layer counts as taking what it emulates, whether
    // or not its share of sleep is taken now.
    (backward ? step_backward_ : step_forward_)[local] += took * slowdown_;
  }
  if (slowdown_ > 1.0) {
    owed_seconds_ += took * (slowdown_ - 1.0);
    if (owed_seconds_ >= kMinSleepSeconds) {
      const auto before = std::chrono::steady_clock::now();
      std::this_thread::sleep_for(std::chrono::duration<double>(owed_seconds_));
      owed_seconds_ -= std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - before)
                           .count();
    }
  }
}

void LayerTiming::EndStep(int64_t micro_batches) {
  const double per =
      1.0 / static_cast<double>(std::max<int64_t>(1, micro_batches));
  if (steps_ended_++ > 0) {
    const bool first = forward_.empty();
    if (first) {
      forward_.assign(step_forward_.size(), 0.0);
      backward_.assign(step_backward_.size(), 0.0);
    }
    for (size_t i = 0; i < step_forward_.size(); ++i) {
      const double f = step_forward_[i] * per, b = step_backward_[i] * per;
      forward_[i] = first ? f : forward_[i] + kNewest * (f - forward_[i]);
      backward_[i] = first ? b : backward_[i] + kNewest * (b - backward_[i]);
    }
  }
  std::fill(step_forward_.begin(), step_forward_.end(), 0.0);
  std::fill(step_backward_.begin(), step_backward_.end(), 0.0);
}

}  // namespace gpipe
