#include "services/nn/layer_timing.h"

#include <algorithm>
#include <thread>

namespace gpipe {
namespace {

// Slowdown sleeps are taken in pieces at least this long: sleeping after
// every microsecond layer would cost more in wake-ups than it emulates.
constexpr double kMinSleepSeconds = 1e-3;

}  // namespace

LayerTiming::LayerTiming(int64_t layers, double slowdown)
    : slowdown_(std::max(1.0, slowdown)),
      step_forward_(layers, 0.0),
      step_backward_(layers, 0.0),
      window_forward_(layers * kWindowSteps, 0.0),
      window_backward_(layers * kWindowSteps, 0.0) {}

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
    const size_t layers = step_forward_.size();
    const int64_t slot = folded_++ % kWindowSteps;
    const int64_t filled = std::min<int64_t>(folded_, kWindowSteps);
    forward_.resize(layers);
    backward_.resize(layers);
    const auto median = [&](const std::vector<double>& window, size_t l) {
      const auto begin = window.begin() + l * kWindowSteps;
      scratch_.assign(begin, begin + filled);
      // The upper median for an even count: a step's time, not a mean.
      std::nth_element(scratch_.begin(), scratch_.begin() + filled / 2,
                       scratch_.end());
      return scratch_[filled / 2];
    };
    for (size_t l = 0; l < layers; ++l) {
      window_forward_[l * kWindowSteps + slot] = step_forward_[l] * per;
      window_backward_[l * kWindowSteps + slot] = step_backward_[l] * per;
      forward_[l] = median(window_forward_, l);
      backward_[l] = median(window_backward_, l);
    }
  }
  std::fill(step_forward_.begin(), step_forward_.end(), 0.0);
  std::fill(step_backward_.begin(), step_backward_.end(), 0.0);
}

}  // namespace gpipe
