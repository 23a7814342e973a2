#include "cli/progress.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace gpipe {
namespace {
constexpr double kMinRateSeconds = 0.25;
}  // namespace

Progress::Progress(int64_t total_steps, FILE* out, int64_t start_step)
    : total_(total_steps),
      start_step_(start_step),
      out_(out),
      tty_(isatty(fileno(out)) != 0),
      start_(absl::Now()),
      last_print_(absl::InfinitePast()) {}

Progress::~Progress() { Finish(); }

std::string Progress::Line(int64_t step, double loss) const {
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start_);
  const int64_t done = step - start_step_;
  const double per_step = step > 0 ? static_cast<double>(samples_) / step : 0.0;
  const int width = 24;
  const int filled = total_ > 0 ? static_cast<int>(width * step / total_) : 0;
  std::string bar(filled, '#');
  bar.resize(width, '.');
  std::string line =
      absl::StrFormat("[%s] step %d/%d  loss %.4f", bar, step, total_, loss);
  // A rate over a few steps in a few milliseconds is noise (a watch that
  // joined a running job read 74000 samples/s against a true 6000).
  if (done > 0 && elapsed >= kMinRateSeconds) {
    const double rate = done * per_step / elapsed;
    const double eta = elapsed / done * (total_ - step);
    absl::StrAppend(&line, absl::StrFormat("  %.0f samples/s  ETA %ds", rate,
                                           static_cast<int>(eta + 0.5)));
  } else if (step < total_) {
    absl::StrAppend(&line, "  (measuring the rate)");
  }
  if (!suffix_.empty()) line += "  " + suffix_;
  return line;
}

void Progress::Update(int64_t step, double loss, int64_t samples) {
  samples_ = samples;
  const absl::Time now = absl::Now();
  // Watching a running job, the first report may carry steps made before
  // the watch began (the status it started from was older): the clock
  // starts at the first report instead. A replay starts it again.
  if (step < last_step_ || step < start_step_ ||
      (last_step_ < 0 && start_step_ > 0) || restart_) {
    start_step_ = step;
    start_ = now;
    restart_ = false;
  }
  last_step_ = step;
  const bool last = step == total_;
  if (tty_) {
    if (!last && now - last_print_ < absl::Milliseconds(100)) return;
    std::fprintf(out_, "\r%s\x1b[K", Line(step, loss).c_str());
    drawn_ = true;
  } else {
    // About twenty lines per run, and at least one every ten seconds.
    const int64_t every = total_ >= 20 ? total_ / 20 : 1;
    if (!last && step % every != 0 && now - last_print_ < absl::Seconds(10))
      return;
    std::fprintf(out_, "%s\n", Line(step, loss).c_str());
  }
  std::fflush(out_);
  last_print_ = now;
}

void Progress::Finish() {
  if (tty_ && drawn_) std::fputc('\n', out_);
  drawn_ = false;
  std::fflush(out_);
}

}  // namespace gpipe
