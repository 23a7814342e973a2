// Reading and checking a JobSpec: the one place that decides whether a job
// can run, so that the coordinator, the CLI and the tests reject the same
// specs with the same messages. Every message starts with the field path
// ("optimizer.lr: ...", "pipeline.balance: ...").
#ifndef GPIPE_SERVICES_PIPELINE_JOB_SPEC_H_
#define GPIPE_SERVICES_PIPELINE_JOB_SPEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/data/dataset.h"

namespace gpipe {

// Limits that keep a spec from asking a worker for more memory than a
// machine has: such a spec is rejected here, naming the field, instead of a
// worker running out of memory (or a size overflowing) later.
inline constexpr int64_t kMaxBatchSize = int64_t{1} << 24;
// Parameters of one layer, which one worker holds whole (16 GiB of fp32,
// before gradients and optimizer state).
inline constexpr int64_t kMaxLayerParameters = int64_t{1} << 32;
// Parameters of the whole model, which a pipeline spreads over its stages
// (GPipe's 6-billion-parameter Transformer is a few of these workers'
// worth): a guard against a typo's size, not a machine's.
inline constexpr int64_t kMaxModelParameters = int64_t{1} << 40;
// One layer's output for one sample (1 GiB of fp32).
inline constexpr int64_t kMaxSampleValues = int64_t{1} << 28;
// One layer's output for a whole training or evaluation batch (16 GiB).
inline constexpr int64_t kMaxBatchValues = int64_t{1} << 32;
// One split of a synthetic dataset, which every worker that reads it makes
// whole (4 GiB of fp32).
inline constexpr int64_t kMaxDatasetValues = int64_t{1} << 30;

// Limits that keep a spec from costing the controller more than a job is
// worth (it keeps every spec, and every event holds a copy), or from holding
// numbers nothing could reach.
inline constexpr int64_t kMaxSpecBytes = int64_t{1} << 20;  // serialized
inline constexpr int64_t kMaxLayers = 10000;
// Micro-batches times stages (chunks): each pass is an op in a worker's
// schedule, which the controller builds for every job it checks. GPipe's
// and its successors' runs use tens to thousands.
inline constexpr int64_t kMaxStagePasses = int64_t{1} << 18;
inline constexpr int64_t kMaxNameBytes = 256;
inline constexpr int64_t kMaxSteps = 1'000'000'000;
inline constexpr int64_t kMaxKeptCheckpoints = 1000;
inline constexpr int64_t kMaxRestarts = 10000;
// What a job that does not say gets: a lost worker must not end it (an
// elastic system's promise), and a job that keeps failing still ends.
inline constexpr int64_t kDefaultMaxRestarts = 10;

// The spec's max_restarts, or kDefaultMaxRestarts when it has none.
inline int64_t MaxRestarts(const gpipe::v1::JobSpec& spec) {
  return spec.has_max_restarts() ? spec.max_restarts() : kDefaultMaxRestarts;
}
inline constexpr int64_t kMaxElasticGraceMs = int64_t{24} * 3600 * 1000;

// pipeline.rebalance with its defaults filled in.
struct RebalanceSettings {
  bool enabled = false;       // absent: on without an explicit balance
  int64_t after_steps = 20;   // warm-up before the first re-partition
  int64_t every_steps = 100;  // at most one re-partition per this many
  double min_gain = 0.10;     // predicted step-time gain that pays
};
RebalanceSettings RebalanceSettingsOf(const gpipe::v1::JobSpec& spec);

// What parsing a spec checks: all of it (CheckJobSpec), or its JSON alone
// for a caller that changes the spec before checking it (gpipectl's flags:
// `--replicas 2` makes valid a spec whose gradient_groups 2 needs two).
enum class SpecCheck { kWhole, kJsonOnly };

// Parses the protobuf JSON form of a JobSpec and checks it. Unknown fields
// are errors: a misspelt option must not silently fall back to its default.
absl::StatusOr<gpipe::v1::JobSpec> ParseJobSpecJson(
    std::string_view json, SpecCheck check = SpecCheck::kWhole);

// ParseJobSpecJson on a file's contents; every error names the file.
absl::StatusOr<gpipe::v1::JobSpec> LoadJobSpecFile(
    const std::string& path, SpecCheck check = SpecCheck::kWhole);

// ValidateJobSpec; first, when the spec's data paths exist here, the fields
// only the data can fill (ResolveDataDependentFields) are filled.
absl::Status CheckJobSpec(gpipe::v1::JobSpec* spec);

// Checks the model (shapes through every layer), the optimizer, the data
// source against the model's input and output, and the pipeline layout.
absl::Status ValidateJobSpec(const gpipe::v1::JobSpec& spec);

// ResolveDataDependentFields, then ValidateJobSpec. A size the data filled
// is checked as if written, and its error says where it came from (a label
// of 300000000 in a CSV was named as the head's out_features, which the
// spec gave as 0).
absl::Status ResolveAndValidateJobSpec(gpipe::v1::JobSpec* spec);

// K and M with their defaults applied (0 means 1).
int64_t StageCount(const gpipe::v1::JobSpec& spec);
// v, the chunks per worker (ChunksPerWorker: 2 for an interleaved schedule
// left without one, 1 for the schedules that do not interleave); the model
// is cut into K x v stages.
int64_t VirtualStageCount(const gpipe::v1::JobSpec& spec);

// Empty when `balance` (positive entries) sums to `layers`, else what is
// wrong with pipeline.balance: "sums to 8 but the model has 5 layers" (the
// sum itself, or "more than" the largest int64 where it overflows).
std::string BalanceSumError(
    const google::protobuf::RepeatedField<int64_t>& balance, int64_t layers);
int64_t ChunkCount(const gpipe::v1::JobSpec& spec);

// The dataset of a job, laid out for its model's input shape, and checked
// against the model (CheckDataFitsModel).
absl::StatusOr<std::unique_ptr<Dataset>> OpenJobDataset(
    const gpipe::v1::JobSpec& spec);

// What only the data can tell (a text file's vocabulary is known once it is
// read): its token ids must index the first layer's embedding, and its
// targets the model's outputs. INVALID_ARGUMENT naming the field, the value
// and the data otherwise, before any id reaches a kernel.
absl::Status CheckDataFitsModel(const gpipe::v1::JobSpec& spec,
                                const Dataset& data);
int64_t MicroBatchCount(const gpipe::v1::JobSpec& spec);
// R, the data-parallel replicas of the pipeline (0 means 1), and G, the
// gradient groups summed in a fixed tree (0 means R).
inline constexpr int64_t kMaxReplicas = 64;
int64_t ReplicaCount(const gpipe::v1::JobSpec& spec);
int64_t GradientGroupCount(const gpipe::v1::JobSpec& spec);

// The step training starts at: init_from.step when the job carries the
// optimizer state of the run it continues, else 0.
inline int64_t InitialStep(const gpipe::v1::JobSpec& spec) {
  return spec.init_from().optimizer_state() ? spec.init_from().step() : 0;
}

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_JOB_SPEC_H_
