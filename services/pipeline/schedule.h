// Pipeline schedules as pure data: for (K stages, M micro-batches, stage) the
// ordered list of ops the stage executes in one step; for interleaved
// schedules, for (K workers, M, v chunks per worker, worker) the ops of the
// worker's v stages in one list, each naming its chunk. Every schedule runs the
// backward ops of a stage in micro-batch order 0..M-1 (with a split
// backward: both halves, each in that order), so every parameter's gradient
// accumulates in the same order as in the reference trainer, whatever else
// the order of ops is.
#ifndef GPIPE_SERVICES_PIPELINE_SCHEDULE_H_
#define GPIPE_SERVICES_PIPELINE_SCHEDULE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"

namespace gpipe {

enum class ScheduleKind {
  kGPipe,     // fill-drain: all forwards, then all backwards
  kOneFOneB,  // PipeDream-Flush: after K-1-stage warm-up forwards, alternate
  // Zero-bubble ZB-H1 (Qi et al. 2024): the backward split into its input
  // half (B, which the stage upstream waits for) and its weight half (W,
  // which nobody waits for). Stage s warms up with K-s forwards, then
  // runs B, W, F in turn with its W's s micro-batches behind its B's, so
  // the deferred W's fill the drain's bubble. Bubble (K-1)/(3M+K-1) for
  // equal F, B and W and M >= K (1F1B: (K-1)/(M+K-1)); every stage holds
  // at most K micro-batches between F and W (1F1B's first stage's peak).
  kZeroBubbleH1,
  // Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM): the model is cut
  // into K x v stages and worker w holds the v stages w, w+K, w+2K, ... (its
  // chunks), so a micro-batch crosses every worker v times. Forwards run in
  // groups of K micro-batches, chunk by chunk; after a warm-up of
  // 2(K-w-1) + (v-1)K forwards each forward is followed by a backward.
  // Bubble (K-1)/(vM+K-1) for equal stages: 1F1B's divided by about v.
  // Needs M to be a multiple of K.
  kInterleaved1F1B,
  // Zero-bubble ZB-V (Qi et al. 2024, "Pipeline Parallelism with
  // Controllable Memory"): the model cut into 2K stages placed in a V, worker
  // w holding stages w and 2K-1-w, each backward split as in ZB-H1. A
  // micro-batch goes down the workers and back up, so worker 0 runs the
  // first and the last stage and every worker's first forward and last
  // weight half come about as early and as late as worker 0's: with the
  // weight halves filling the rest, bubble (K-1)/(6M+K-1) for equal F, B and
  // W (half ZB-H1's) at a peak of 2K half-size micro-batches per worker
  // (1F1B's first stage's). Always 2 chunks per worker; any M.
  kZeroBubbleV,
};

// kBackward is the whole backward of a micro-batch (input and parameter
// gradients); kBackwardInput computes the input gradient and defers the
// parameter gradients to the micro-batch's kBackwardWeight.
//
// The transfers are actions of their own (WithTransfers adds them): a
// forward computes on the activation its kReceiveActivation took off the
// upstream link and leaves its output for its kSendActivation; a backward
// (or input half) computes on the gradient its kReceiveGradient took off
// the downstream link and leaves the input gradient for its kSendGradient.
// A receive blocks until the link delivers; links deliver in the order
// things were sent, so a receive must name the micro-batch its neighbour
// sent next.
enum class OpKind {
  kForward,
  kBackward,
  kBackwardInput,
  kBackwardWeight,
  kOptimizerStep,
  kReceiveActivation,
  kSendActivation,
  kReceiveGradient,
  kSendGradient,
};

struct Op {
  OpKind kind;
  int64_t micro_batch;  // -1 for the optimizer step
  // Which of its worker's stages the op runs on (schedules with chunks;
  // StageOfChunk says which stage that is). Always 0 otherwise.
  int64_t chunk = 0;

  bool operator==(const Op& o) const {
    return kind == o.kind && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

// The ops of `stage` (0-based, < k) for one step with `m` micro-batches,
// ending with the optimizer step. Requires k >= 1, m >= 1. An interleaved
// kind gives its one-chunk form, 1F1B: MakeWorkerSchedule gives chunks.
std::vector<Op> MakeSchedule(ScheduleKind kind, int64_t k, int64_t m,
                             int64_t stage);

// How long a stage's forward, input half and weight half of a micro-batch
// take, in ticks of any one length: what ZB-V orders its ops by. Integers,
// so that every worker that builds the order from the same ticks gets the
// same order (ScheduleTicks in simulator.h makes them from costs).
struct PhaseTicks {
  int64_t forward = 1;
  int64_t input = 1;
  int64_t weight = 1;

  bool operator==(const PhaseTicks& o) const {
    return forward == o.forward && input == o.input && weight == o.weight;
  }
};

// The longest phase a tick count may say (the cost model's longest is
// 1000): more could overflow the order's clock.
inline constexpr int64_t kMaxPhaseTicks = int64_t{1} << 20;
// Empty when `ticks` are none or one set per stage of `stages` (K x v),
// each phase in [1, kMaxPhaseTicks]; else what is wrong with them.
std::string PhaseTicksError(std::span<const PhaseTicks> ticks, int64_t stages);

// The ops of worker `worker` (< k) holding `v` chunks, ending with one
// optimizer step (which updates every chunk). For a schedule without chunks,
// MakeSchedule's ops; interleaved with v = 1 is 1F1B, ZB-V with v = 1 ZB-H1.
// ZB-V orders its ops for `ticks` (its 2K stages' times in model order;
// none, or ticks PhaseTicksError refuses, mean equal times). Every
// worker of a step must be given the same ticks. Requires k >= 1, m >= 1,
// v >= 1, a shape ScheduleShapeError accepts.
std::vector<Op> MakeWorkerSchedule(ScheduleKind kind, int64_t k, int64_t m,
                                   int64_t v, int64_t worker,
                                   std::span<const PhaseTicks> ticks = {});
// MakeWorkerSchedule of every worker 0..k-1, for callers that run them all
// (ZB-V's order is built once for all workers, not once each).
std::vector<std::vector<Op>> MakeWorkerSchedules(
    ScheduleKind kind, int64_t k, int64_t m, int64_t v,
    std::span<const PhaseTicks> ticks = {});

// `ops` (one worker's compute ops, MakeWorkerSchedule's or a hand-made
// list, over `v` chunks placed as `kind` places them; worker `worker` of
// `k`) with every transfer made an action next to the op it serves: each
// forward's activation received just before it (not on the model's first
// stage) and sent just after it (not on the last); each backward's or input
// half's gradient received just before it (not on the last stage) and the
// input gradient sent just after it (not on the first). A list that already
// has transfers comes back as it is.
std::vector<Op> WithTransfers(const std::vector<Op>& ops, ScheduleKind kind,
                              int64_t k, int64_t v, int64_t worker);
bool HasTransfers(const std::vector<Op>& ops);
bool IsTransfer(OpKind kind);

// Whether the schedule places several chunks on each worker.
bool Interleaves(ScheduleKind kind);
// Where the chunks of a schedule's K workers sit among its K x v stages.
// Interleaved 1F1B goes round the workers: worker w's chunk c is stage
// c * K + w. ZB-V goes down and back: chunk 0 is stage w, chunk 1 stage
// 2K-1-w. Any other schedule: stage w, chunk 0.
int64_t StageOfChunk(ScheduleKind kind, int64_t k, int64_t worker,
                     int64_t chunk);
int64_t WorkerOfStage(ScheduleKind kind, int64_t k, int64_t stage);
int64_t ChunkOfStage(ScheduleKind kind, int64_t k, int64_t stage);
// How many chunks a worker holds when the spec says `virtual_stages`: ZB-V
// always 2; the interleaved schedule what it is told, 2 when told nothing
// (0); the others 1.
int64_t ChunksPerWorker(ScheduleKind kind, int64_t virtual_stages);
// What a worker process that runs several chunks of an interleaved schedule
// (Assignment.chunks) says in its hello (WorkerHello.capabilities).
inline constexpr std::string_view kChunksCapability = "chunks";
// What a worker that places ZB-V's chunks in a V says (one that says only
// "chunks" expects them round robin and would refuse the assignment).
inline constexpr std::string_view kZeroBubbleVCapability = "zb-v";
// Empty when (k, m, v) suit `kind`, else what does not (for the job spec's
// validation and the in-process pipeline).
std::string ScheduleShapeError(ScheduleKind kind, int64_t k, int64_t m,
                               int64_t v);

// Whether the schedule splits the backward (kBackwardInput/Weight ops).
bool SplitsBackward(ScheduleKind kind);

// "gpipe" / "1f1b" / "zb-h1" / "interleaved" / "zb-v".
std::string_view ScheduleName(ScheduleKind kind);
absl::StatusOr<ScheduleKind> ParseScheduleName(std::string_view name);
// The job spec's enum and ours, the only place they are converted
// (unspecified: GPipe).
ScheduleKind ScheduleFromSpec(gpipe::v1::Schedule schedule);
gpipe::v1::Schedule ScheduleToSpec(ScheduleKind kind);

// Most micro-batches whose activations a stage holds at once under `ops`
// (a forward makes one live, its backward or its weight half releases it);
// with `chunk` >= 0, counting that chunk's ops only.
int64_t MaxLiveMicroBatches(const std::vector<Op>& ops, int64_t chunk = -1);
// Most micro-batches between their input half and their weight half at
// once: each holds its GEMMs' output gradients for the weight half.
int64_t MaxDeferredMicroBatches(const std::vector<Op>& ops);

// "F3", "B0" (the whole backward, or with a split backward its input
// half), "W0" (the weight half), "step"; the transfers "ra3" / "sa3"
// (receive / send micro-batch 3's activation) and "rg3" / "sg3" (its
// gradient); an op of chunk c > 0 ends in "/c" ("F3/1").
std::string ToString(const Op& op);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_SCHEDULE_H_
