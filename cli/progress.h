// Progress of a training run: a redrawn bar on a terminal, plain lines
// otherwise (CI logs, pipes), with step, loss, samples/s and ETA.
#ifndef GPIPE_CLI_PROGRESS_H_
#define GPIPE_CLI_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/time/time.h"

namespace gpipe {

class Progress {
 public:
  // `out` is usually stderr; the bar is drawn only when it is a terminal.
  // `start_step`: steps already done when watching begins (a job watched
  // mid-run), so rates and ETA count only what happens from now on.
  Progress(int64_t total_steps, FILE* out = stderr, int64_t start_step = 0);
  ~Progress();

  // Reports that `step` (1-based) finished with `loss` after `samples` samples.
  // A step below the last one reported is a replay (the job restarted from
  // a checkpoint): rates and ETA count again from there, never negative.
  void Update(int64_t step, double loss, int64_t samples);
  // Text drawn after the bar from the next Update on (e.g. per-stage
  // utilization and bubble); empty for none.
  void SetSuffix(std::string suffix) { suffix_ = std::move(suffix); }
  // Rates and ETA count again from the next Update: a watch that was away
  // (its controller restarted) counted the outage as the job's time.
  void RestartRate() { restart_ = true; }
  // Ends the bar's line so other output can follow on a fresh one; a later
  // Update() draws the bar again below it.
  void Finish();

 private:
  std::string Line(int64_t step, double loss) const;

  int64_t total_;
  int64_t start_step_;
  FILE* out_;
  bool tty_;
  absl::Time start_;
  absl::Time last_print_;
  int64_t samples_ = 0;
  int64_t last_step_ = -1;
  bool drawn_ = false;
  bool restart_ = false;
  std::string suffix_;
};

}  // namespace gpipe

#endif  // GPIPE_CLI_PROGRESS_H_
