// Runs the worker's stage assignment: opens its data, connects its links
// (the downstream one through a DownstreamConnector, the upstream one handed
// over by the Exchange handler), builds the stage, restores its checkpoint,
// runs the steps (progress, checkpoints, evaluations), the final evaluation,
// and writes the stage's final parameters. Holds nothing beyond the
// assignment: a cancelled or lost assignment leaves no state behind.
#ifndef GPIPE_WORKER_EXECUTOR_H_
#define GPIPE_WORKER_EXECUTOR_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gpipe/v1/controller.pb.h"
#include "services/pipeline/stage.h"
#include "services/telemetry/stage_metrics.h"
#include "services/tensor/dtype.h"
#include "services/transport/exchange_link.h"
#include "worker/downstream_connector.h"
#include "worker/memory_resume.h"
#include "worker/shared_path_store.h"
#include "worker/stage_file_store.h"

namespace gpipe {

class Executor {
 public:
  using Reporter = std::function<void(const gpipe::v1::WorkerMessage&)>;
  // `threads`: compute threads for the stage; `report` sends progress,
  // completion and failure to the controller; `metrics` (optional, not
  // owned) receives each step's figures and the links' traffic; `device`:
  // where stages compute.
  Executor(int threads, Reporter report, PipelineMetrics* metrics = nullptr,
           Device device = Device::kCpu);
  ~Executor();  // cancels and joins the running assignment

  // Starts `a`, cancelling whatever ran before. An assignment with chunks
  // (an interleaved schedule) runs their stages on one thread in the order
  // of its worker schedule (MakeWorkerSchedule).
  void Start(const gpipe::v1::Assignment& a);
  // Cancels the assignment of (job, epoch) if it is the current one.
  void Cancel(const std::string& job_id, int64_t epoch);
  void CancelAll();
  // The bubble the controller computed for this worker from the running
  // cut's measured stage times (CutBubble), for the assignment of (job,
  // epoch) if it is the current one: the predicted-bubble gauge's value
  // from now on.
  void SetCutBubble(const std::string& job_id, int64_t epoch, double bubble);

  // The Exchange handler offers the server end of an upstream link (from
  // stage - 1 of this worker's replica, for each stage it runs: one, or the
  // chunks of an interleaved schedule), or with replicas a gradient
  // reduction link (from this same stage of a lower replica). Waits up to
  // `wait_ms` for a matching assignment (it may still be on its way from the
  // controller); rejects frames of another job or an older epoch.
  // `stream_key`: what the stream presented, checked against the
  // assignment's key (PERMISSION_DENIED); nullopt: not checked.
  absl::Status AcceptUpstream(
      const std::string& job_id, int64_t epoch, int64_t from_stage,
      int64_t from_replica, std::shared_ptr<Link> link, int64_t wait_ms,
      const std::optional<std::string>& stream_key = std::nullopt);

  bool busy() const;

  // Sends the stage's op timeline of every n-th step to the controller (a
  // StepTrace before the step's progress report); 0: none. Set before the
  // first Start.
  void set_trace_every(int64_t n) { trace_every_ = n; }
  // TLS for the downstream Exchange client (the assignment's stream key is
  // added per link). Set before the first Start.
  void set_exchange_credentials(ExchangeCredentials c) {
    exchange_credentials_ = std::move(c);
  }
  // The data planes this worker offers its next stage and accepts from its
  // previous one (--data_plane). Set before the first Start.
  void set_data_plane(const DataPlaneOptions& o) { data_plane_ = o; }
  // Every layer of this worker's stages takes this many times as long
  // (--compute_slowdown, StagePlacement). Set before the first Start.
  void set_compute_slowdown(double f) { compute_slowdown_ = f; }
  const DataPlaneOptions& data_plane() const { return data_plane_; }
  // How stages reach their next stage; default: gRPC with the credentials
  // and data planes set above. Set before the first Start.
  void set_downstream_connector(std::unique_ptr<DownstreamConnector> c) {
    connector_ = std::move(c);
  }
  // Where assignments with CHECKPOINT_TRANSPORT_CONTROLLER save and restore
  // their files (the controller's API); without one they fail. Shared-path
  // assignments use the paths they name. Set before the first Start.
  void set_controller_file_store(std::unique_ptr<StageFileStore> s) {
    controller_files_ = std::move(s);
  }
  // Bytes of host tensors a stage may hold (what the worker advertises);
  // 0: no limit. A stage the memory model (memory_model.h) says needs more
  // fails before it allocates anything, and an allocation past it fails the
  // stage (TensorMemoryLimit); both as OutOfMemory, a failure of the job, not
  // of this worker. Set before the first Start.
  void set_memory_budget(int64_t bytes) { memory_budget_ = bytes; }
  // How long a stage's state kept for a resume from memory (Park) waits for
  // the assignment that uses it; then it is freed. Set before the first
  // Start.
  void set_parked_state_ttl(std::chrono::milliseconds ttl) {
    parked_ttl_ = ttl;
  }
  // Steps of the state kept for a resume from memory, -1 when none is kept.
  int64_t parked_step() const;

 private:
  struct Run;        // one assignment, as Start and Cancel see it
  struct Execution;  // what the assignment's thread builds as it goes
  void Execute(std::shared_ptr<Run> run);
  // The steps of Execute, in order.
  // The bytes the run's stages need (the memory model's, with a parked
  // state it resumes from), or OutOfMemory when more than the budget; 0
  // where no budget applies.
  absl::StatusOr<int64_t> CheckMemory(
      const std::vector<std::unique_ptr<Execution>>& xs) const;
  // Run::segment_room for stages that `need` that much.
  int64_t SegmentRoom(const std::vector<std::unique_ptr<Execution>>& xs,
                      int64_t need) const;
  // The shared memory of the segments the run's links created: what its
  // tensors must leave room for.
  int64_t MappedBytes(const std::vector<std::unique_ptr<Execution>>& xs) const;
  // What the run's host tensors may hold (TensorMemoryLimit; 0: no limit):
  // the budget less those segments, but at least what the stages need.
  int64_t TensorLimit(const std::vector<std::unique_ptr<Execution>>& xs) const;
  // Two of the run's chunks next to each other in the pipeline (ZB-V's turn,
  // every chunk of a one-worker pipeline) talk over an in-process link: no
  // port to dial, nothing serialized.
  absl::Status LinkOwnChunks(Run& run,
                             const std::vector<std::unique_ptr<Execution>>& xs);
  absl::Status ConnectDownstream(Execution& x);
  absl::Status AwaitUpstream(Execution& x);
  // With replicas: dials the replicas of this stage above this one, waits
  // for those below, and sums gradients over those links (LinkReduction).
  absl::Status ConnectReplicas(Execution& x);
  absl::Status BuildStage(Execution& x);
  // Loads the spec's init_from weights into a stage that restores no
  // checkpoint.
  absl::Status InitFrom(Execution& x);
  absl::Status Restore(Execution& x);
  // Restore's part for an assignment that resumes in memory.
  absl::Status ResumeInMemory(Execution& x);
  // After an assignment of several replicas ended without finishing: keeps
  // its stage's state when it lies on a step boundary, and says so.
  void Park(Execution& x);
  // Replaces the parked state (under mu_; a new one gets its TTL).
  void SetParked(std::unique_ptr<ParkedStage> p);
  // The reaper thread: frees a parked state whose TTL ran out while no
  // assignment runs (one that runs may be resuming from it).
  void ReapParked();
  absl::Status RunSteps(const std::vector<std::unique_ptr<Execution>>& xs);
  absl::Status Finish(const std::vector<std::unique_ptr<Execution>>& xs);
  // Closes every chunk's links to its neighbours in the pipeline, so that
  // nothing waits on a part that failed.
  static void ClosePipelineLinks(
      const std::vector<std::unique_ptr<Execution>>& xs);
  // The test split's evaluation, every chunk taking part; the loss of the
  // pipeline's last stage when this worker runs it, else zeros.
  absl::StatusOr<LossResult> Evaluate(
      const std::vector<std::unique_ptr<Execution>>& xs);
  // Parts of RunSteps.
  // `worker_busy_seconds`: the step's busy time of every stage this worker
  // runs (its chunks), this one's included.
  void ReportStep(Execution& x, int64_t step, const StageStepResult& r,
                  double seconds, double worker_busy_seconds);
  absl::Status Checkpoint(Execution& x, int64_t done);
  // The store of the assignment's checkpoint transport.
  absl::StatusOr<StageFileStore*> FilesFor(const gpipe::v1::Assignment& a);
  bool cancelled(const Run& run) const;
  // The budget that host tensors are held to: none (0) on a GPU worker, whose
  // stages' tensors are the device's.
  int64_t HostBudget() const {
    return device_ == Device::kCpu ? std::max<int64_t>(0, memory_budget_) : 0;
  }
  // AcceptUpstream's part for a reduction link of the current assignment.
  absl::Status AcceptReplicaLocked(int64_t from_replica,
                                   std::shared_ptr<Link> link);
  void StopLocked(std::unique_lock<std::mutex>& lock);

  const int threads_;
  Reporter report_;
  PipelineMetrics* const metrics_;
  int64_t trace_every_ = 1;
  ExchangeCredentials exchange_credentials_;
  DataPlaneOptions data_plane_;
  double compute_slowdown_ = 1.0;
  std::unique_ptr<DownstreamConnector> connector_;
  SharedPathStore shared_files_;
  std::unique_ptr<StageFileStore> controller_files_;
  const Device device_;
  int64_t memory_budget_ = 0;
  std::chrono::milliseconds parked_ttl_{std::chrono::minutes(2)};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Run> current_;
  std::thread thread_;
  std::chrono::steady_clock::time_point parked_until_;  // under mu_
  bool shutting_down_ = false;                          // under mu_
  std::thread reaper_;
  // The state the last assignment left (Park); only the assignment thread
  // changes it (SetParked, under mu_), and only one runs at a time.
  std::unique_ptr<ParkedStage> parked_;
};

}  // namespace gpipe

#endif  // GPIPE_WORKER_EXECUTOR_H_
