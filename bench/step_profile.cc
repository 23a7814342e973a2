#include "bench/step_profile.h"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "absl/strings/str_cat.h"
#include "bench/timing.h"
#include "services/nn/loss.h"
#include "services/nn/optimizer.h"
#include "services/pipeline/micro_batch.h"
#include "services/tensor/device.h"

namespace gpipe::bench {

StepProfile ProfileSteps(ReferenceTrainer& trainer, int steps) {
  const gpipe::v1::JobSpec& spec = trainer.spec();
  Model& model = trainer.model();
  const int64_t batch_size = spec.batch_size();
  const int64_t train_size = trainer.dataset().size(Split::kTrain);
  const int64_t n = model.size();

  StepProfile p;
  p.parts.push_back({"gather batch"});
  for (int64_t i = 0; i < n; ++i)
    p.parts.push_back({absl::StrCat("layers.", model.begin() + i, " ",
                                    std::string(model.layer(i).kind())),
                       0.0, 0.0, model.begin() + i});
  p.parts.push_back({"loss (softmax cross-entropy)"});
  p.parts.push_back({kUpdatePart});
  StepProfile::Part& gather = p.parts.front();
  StepProfile::Part& loss = p.parts[n + 1];
  StepProfile::Part& update = p.parts[n + 2];

  // On a GPU, kernels are queued: each piece waits for its own before its
  // timer stops (the sum is then longer than an unprofiled step).
  const Device device = trainer.device();
  const auto timed_ms = [device](const std::function<void()>& piece) {
    return 1e3 * TimeSeconds([&] {
             piece();
             if (device == Device::kCuda) SynchronizeCuda();
           });
  };
  std::vector<int64_t> indices(batch_size);
  for (int s = 0; s < steps; ++s) {
    const int64_t step = trainer.step() + s;
    for (int64_t i = 0; i < batch_size; ++i)
      indices[i] = (step * batch_size + i) % train_size;
    Batch batch;
    gather.forward_ms += timed_ms(
        [&] { batch = trainer.dataset().Gather(Split::kTrain, indices); });
    const double normalizer = std::max<int64_t>(CountTargets(batch.targets), 1);
    LayerContext ctx;
    ctx.training = true;
    ctx.seed = spec.seed();
    ctx.step = step;
    const std::vector<RowRange> ranges =
        SplitMicroBatches(batch.inputs.dim(0), trainer.micro_batches());
    for (int64_t m = 0; m < static_cast<int64_t>(ranges.size()); ++m) {
      ctx.micro_batch = m;
      std::vector<Saved> saved(n);
      Tensor h;
      gather.forward_ms += timed_ms([&] {
        h = batch.inputs.Rows(ranges[m].begin, ranges[m].end).To(device);
      });
      const Tensor targets = batch.targets.Rows(ranges[m].begin, ranges[m].end);
      for (int64_t i = 0; i < n; ++i) {
        ctx.layer_index = model.begin() + i;
        p.parts[1 + i].forward_ms +=
            timed_ms([&] { h = model.layer(i).Forward(h, ctx, &saved[i]); });
      }
      Tensor g;
      loss.forward_ms += timed_ms(
          [&] { SoftmaxCrossEntropyLoss(h, targets, normalizer, &g); });
      for (int64_t i = n; i-- > 0;) {
        ctx.layer_index = model.begin() + i;
        ctx.input_grad = InputGradUsed(ctx.layer_index);
        p.parts[1 + i].backward_ms +=
            timed_ms([&] { g = model.layer(i).Backward(g, saved[i], ctx); });
      }
    }
    update.forward_ms += timed_ms([&] {
      const std::vector<NamedParameter>& params = model.Parameters();
      const double squares = ClipsGradients(spec.optimizer())
                                 ? AccumulateGradSquares(params, 0.0)
                                 : 0.0;
      ScaleGradients(params,
                     ClipCoefficient(squares, spec.optimizer().clip_norm()));
      trainer.optimizer().Step(
          LearningRate(spec.optimizer(), step, spec.steps()), step + 1);
      model.ZeroGrad();
    });
  }
  for (StepProfile::Part& part : p.parts) {
    part.forward_ms /= std::max(steps, 1);
    part.backward_ms /= std::max(steps, 1);
    p.total_ms += part.forward_ms + part.backward_ms;
  }
  return p;
}

void PrintProfile(const StepProfile& p) {
  std::printf(
      "\nprofile (mean of the instrumented steps; timers around each "
      "layer add a little):\n");
  std::printf("  %-32s %10s %10s %7s\n", "part", "fwd ms", "bwd ms", "share");
  for (const StepProfile::Part& part : p.parts) {
    const double ms = part.forward_ms + part.backward_ms;
    std::printf("  %-32s %10.3f %10.3f %6.1f%%\n", part.name.c_str(),
                part.forward_ms, part.backward_ms,
                p.total_ms > 0 ? 100.0 * ms / p.total_ms : 0.0);
  }
  std::printf("  %-32s %21.3f\n", "total", p.total_ms);
}

}  // namespace gpipe::bench
