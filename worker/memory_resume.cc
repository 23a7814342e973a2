#include "worker/memory_resume.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/pipeline/stage_checkpoint.h"

namespace gpipe {
namespace {

// Resume messages ride the reduction link as kReduceSlice with these
// phases (the gradient sum uses 0 and 1); `step` is the resume step.
constexpr int64_t kHoldsPhase = 2;
constexpr int64_t kStatePhase = 3;

Message ResumeMessage(int64_t step, int64_t phase, Tensor t) {
  Message m;
  m.kind = MessageKind::kReduceSlice;
  m.step = step;
  m.micro_batch = phase;
  m.tensor = std::move(t);
  return m;
}

absl::StatusOr<Message> ReceiveResume(Link& link, int64_t from, int64_t step,
                                      int64_t phase) {
  ASSIGN_OR_RETURN(Message m, link.Receive());
  if (m.kind != MessageKind::kReduceSlice || m.step != step ||
      m.micro_batch != phase || !m.tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resume at step ", step, ": expected ",
        phase == kHoldsPhase ? "whether it holds the state" : "a state tensor",
        " from replica ", from, ", received ", Describe(m)));
  }
  return m;
}

}  // namespace

int64_t ParkedBytes(const ParkedStage& parked) {
  int64_t bytes = 0;
  for (const auto& [name, t] : parked.state) bytes += t.nbytes();
  for (const auto& [name, t] : parked.grads) bytes += t.nbytes();
  if (parked.running_statistics.defined())
    bytes += parked.running_statistics.nbytes();
  return bytes;
}

ParkedStage ParkStage(Stage& stage, const gpipe::v1::JobSpec& spec,
                      const std::string& job_id, int64_t step) {
  ParkedStage parked;
  parked.job_id = job_id;
  parked.spec = spec.SerializeAsString();
  parked.last_update_step = stage.last_update_step();
  parked.last_update_squares = stage.last_update_squares();
  parked.layer_begin = stage.placement().layer_begin;
  parked.layer_end = stage.placement().layer_end;
  parked.step = step;
  const StageFileContent content = CheckpointContent(stage, step);
  for (const auto& [name, tensor] : content.tensors)
    parked.state.emplace(name, tensor->Clone());
  parked.pending = stage.pending_update() == step;
  if (parked.pending) {
    // On the host, as the state: a GPU stage's allocator goes with it.
    for (const NamedParameter& p : stage.model().Parameters()) {
      const Tensor& g = p.param->grad;
      parked.grads.emplace(
          p.name, g.device() == Device::kCpu ? g.Clone() : g.To(Device::kCpu));
    }
    const Tensor rows = stage.pending_running_statistics();
    if (rows.defined()) parked.running_statistics = rows.Clone();
  }
  return parked;
}

bool HoldsState(const ParkedStage* parked, const Stage& stage,
                const gpipe::v1::JobSpec& spec, const std::string& job_id,
                int64_t step) {
  return parked != nullptr && parked->job_id == job_id &&
         parked->spec == spec.SerializeAsString() && parked->step == step &&
         parked->layer_begin == stage.placement().layer_begin &&
         parked->layer_end == stage.placement().layer_end;
}

absl::StatusOr<int64_t> ResumeFromMemory(
    Stage& stage, const gpipe::v1::JobSpec& spec, int64_t replica,
    const std::vector<Link*>& peers, const ParkedStage* own,
    const std::string& job_id, int64_t step,
    std::optional<double> roll_forward_squares) {
  bool holds = HoldsState(own, stage, spec, job_id, step);
  bool loaded = false;
  if (!holds && roll_forward_squares.has_value() &&
      HoldsState(own, stage, spec, job_id, step - 1) && own->pending) {
    RETURN_IF_ERROR(LoadStageState(stage, own->state, "memory"));
    RETURN_IF_ERROR(stage.RollForward(step - 1, *roll_forward_squares,
                                      own->grads, own->running_statistics));
    holds = loaded = true;
  }
  const int64_t replicas = std::max<int64_t>(1, peers.size());
  // Who holds it: every replica tells every other, so all agree.
  std::vector<bool> held(replicas, false);
  held[replica] = holds;
  for (int64_t q = 0; q < replicas; ++q) {
    if (q == replica || peers[q] == nullptr) continue;
    Tensor flag = Tensor::Empty({1});
    flag.f32()[0] = holds ? 1.0f : 0.0f;
    RETURN_IF_ERROR(peers[q]->Send(ResumeMessage(step, kHoldsPhase, flag)));
  }
  for (int64_t q = 0; q < replicas; ++q) {
    if (q == replica || peers[q] == nullptr) continue;
    ASSIGN_OR_RETURN(Message m, ReceiveResume(*peers[q], q, step, kHoldsPhase));
    held[q] = m.tensor.numel() == 1 && m.tensor.dtype() == DType::kF32 &&
              m.tensor.f32()[0] == 1.0f;
  }
  const auto source = std::find(held.begin(), held.end(), true);
  if (source == held.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("resume: no replica of stage ", stage.placement().index,
                     " holds its state after step ", step, " in memory"));
  }
  const int64_t from = source - held.begin();
  if (holds && !loaded)
    RETURN_IF_ERROR(LoadStageState(stage, own->state, "memory"));
  if (from == replica) {
    // The tensors in the order every replica's own stage lists them.
    const StageFileContent content = CheckpointContent(stage, step);
    for (int64_t q = 0; q < replicas; ++q) {
      if (held[q] || peers[q] == nullptr) continue;
      for (const auto& [name, tensor] : content.tensors)
        RETURN_IF_ERROR(
            peers[q]->Send(ResumeMessage(step, kStatePhase, tensor->Clone())));
    }
    return from;
  }
  if (holds) return from;
  std::map<std::string, Tensor> received;
  const StageFileContent wanted = CheckpointContent(stage, step);
  for (const auto& [name, tensor] : wanted.tensors) {
    ASSIGN_OR_RETURN(Message m,
                     ReceiveResume(*peers[from], from, step, kStatePhase));
    received.emplace(name, std::move(m.tensor));
  }
  RETURN_IF_ERROR(LoadStageState(stage, received,
                                 absl::StrCat("replica ", from, "'s memory")));
  return from;
}

}  // namespace gpipe
