// The stage's part of an evaluation (Stage::RunEval): batches streamed down
// the pipeline with a receipt back for each, and a failure of one stage's
// own part told to every other, so that all end at once with their links
// up.
#include <numeric>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/pipeline/stage.h"
#include "services/tensor/allocator.h"

namespace gpipe {

namespace {

constexpr char kEvalFailurePayload[] = "gpipe.dev/evaluation-failure";

// A link that failed under an evaluation: not this stage's part, and not
// one its neighbours can be told of.
absl::Status LinkFailure(absl::Status s) {
  s.SetPayload(kEvalFailurePayload, absl::Cord("link"));
  return s;
}

bool HasEvalFailure(const absl::Status& s, absl::string_view what) {
  const auto p = s.GetPayload(kEvalFailurePayload);
  return p.has_value() && *p == what;
}

}  // namespace

absl::Status MarkEvalFailedHere(absl::Status s) {
  s.SetPayload(kEvalFailurePayload, absl::Cord("here"));
  return s;
}

bool EvalFailedHere(const absl::Status& s) { return HasEvalFailure(s, "here"); }

bool EvalEndedElsewhere(const absl::Status& s) {
  return HasEvalFailure(s, "elsewhere");
}

void Stage::TellEvalFailed(int64_t origin, const Link* except) {
  for (Link* link : {upstream_, downstream_}) {
    if (link == nullptr || link == except) continue;
    Message m;
    m.kind = MessageKind::kEvalFailed;
    m.step = kEvalStep;
    m.micro_batch = origin;
    // A neighbour already gone has nothing left to end.
    link->Send(std::move(m)).IgnoreError();
  }
}

absl::Status Stage::EndedElsewhere(const Message& in, const Link* from) {
  TellEvalFailed(in.micro_batch, from);
  absl::Status s = absl::AbortedError(absl::StrCat(
      "stage ", placement_.index, ": the evaluation ended: ", Describe(in)));
  s.SetPayload(kEvalFailurePayload, absl::Cord("elsewhere"));
  return MarkConsequence(std::move(s));
}

absl::Status Stage::AfterFailedSend(Link* link, absl::Status failed) {
  // Only a link its peer let go of is drained: a send refused for another
  // reason (a bad release count on the shared-memory plane) leaves the
  // inbox open, and a receive there would wait for ever.
  if (!absl::IsUnavailable(failed) && !absl::IsCancelled(failed))
    return LinkFailure(std::move(failed));
  // A neighbour that ended its evaluation on another stage's failure told
  // this one before it let go of the link: what it left queued says so,
  // after a batch and the end marker at most.
  constexpr int kQueuedBeforeTheFailure = 2;
  for (int i = 0; i <= kQueuedBeforeTheFailure; ++i) {
    absl::StatusOr<Message> m = link->Receive();
    if (!m.ok()) break;
    if (m->kind == MessageKind::kEvalFailed) return EndedElsewhere(*m, link);
  }
  return LinkFailure(std::move(failed));
}

absl::Status Stage::AwaitEvalTaken(int64_t b) {
  absl::StatusOr<Message> received = downstream_->Receive();
  if (!received.ok()) return LinkFailure(received.status());
  Message& in = *received;
  if (in.kind == MessageKind::kEvalFailed)
    return EndedElsewhere(in, downstream_);
  if (in.kind != MessageKind::kEvalTaken || in.step != kEvalStep ||
      in.micro_batch != b) {
    return absl::InternalError(
        absl::StrCat("stage ", placement_.index,
                     ": expected the receipt of evaluation batch ", b,
                     ", received ", Describe(in)));
  }
  return absl::OkStatus();
}

// Evaluation streams batches down the pipe until the first stage sends the
// end marker, so middle stages need neither the dataset nor its size.
absl::StatusOr<LossResult> Stage::RunEval(Split split, int64_t max_samples,
                                          std::vector<Tensor>* outputs) {
  absl::StatusOr<LossResult> r;
  try {
    r = RunEvalBatches(split, max_samples, outputs);
  } catch (const AllocationCancelled&) {
    throw;
  } catch (...) {
    // Out of memory, most likely: the neighbours end theirs, then the
    // caller learns why.
    TellEvalFailed(placement_.index, nullptr);
    throw;
  }
  if (r.ok() || EvalEndedElsewhere(r.status())) return r;
  if (HasEvalFailure(r.status(), "link") || absl::IsCancelled(r.status()))
    return r;
  TellEvalFailed(placement_.index, nullptr);
  return MarkEvalFailedHere(r.status());
}

absl::StatusOr<LossResult> Stage::RunEvalBatches(Split split,
                                                 int64_t max_samples,
                                                 std::vector<Tensor>* outputs) {
  OnStage on_stage(*this);
  Counted().ResetPeak();
  const int64_t batch_size = spec_.eval().batch_size() > 0
                                 ? spec_.eval().batch_size()
                                 : spec_.batch_size();
  int64_t n = dataset_ != nullptr ? dataset_->size(split) : 0;
  if (max_samples > 0) n = std::min(n, max_samples);
  LossResult total;
  std::vector<int64_t> indices;
  int64_t sent = 0;
  for (int64_t b = 0;; ++b) {
    Tensor x;
    if (placement_.first()) {
      if (b * batch_size >= n) break;
    } else {
      absl::StatusOr<Message> received = upstream_->Receive();
      if (!received.ok()) return LinkFailure(received.status());
      Message& in = *received;
      if (in.kind == MessageKind::kEvalEnd) break;
      if (in.kind == MessageKind::kEvalFailed)
        return EndedElsewhere(in, upstream_);
      if (in.kind != MessageKind::kActivation || in.step != kEvalStep ||
          in.micro_batch != b) {
        return absl::InternalError(absl::StrCat(
            "stage ", placement_.index, ": expected evaluation batch ", b,
            ", received ", Describe(in)));
      }
      RETURN_IF_ERROR(CheckArrived(in.tensor, /*activation=*/true, b,
                                   /*rows=*/0, batch_size));
      x = std::move(in.tensor);
      // Taken off the queue: the stage before may send the next batch, so
      // at most one waits here while this one runs.
      Message taken;
      taken.kind = MessageKind::kEvalTaken;
      taken.step = kEvalStep;
      taken.micro_batch = b;
      if (absl::Status sent = upstream_->Send(std::move(taken)); !sent.ok())
        return AfterFailedSend(upstream_, sent);
    }
    Batch batch;
    if (placement_.first() || placement_.last()) {
      const int64_t begin = b * batch_size;
      const int64_t end = std::min(n, begin + batch_size);
      if (begin >= end) {
        return absl::InternalError(
            absl::StrCat("stage ", placement_.index, ": evaluation batch ", b,
                         " is past the end of the split"));
      }
      indices.resize(end - begin);
      std::iota(indices.begin(), indices.end(), begin);
      if (placement_.first()) {
        batch = dataset_->Gather(split, indices);
        x = batch.inputs;
      } else {
        batch.targets = dataset_->GatherTargets(split, indices);
      }
    }
    if (device_ != nullptr) x = device_->ToDevice(x);
    Tensor y = model_->Forward(x, Context(kEvalStep, b), nullptr);
    if (placement_.last()) {
      if (outputs != nullptr) outputs->push_back(y.To(Device::kCpu));
      const LossResult r =
          SoftmaxCrossEntropyLoss(y, batch.targets, 1.0, nullptr);
      RETURN_IF_ERROR(CheckTargetsInRange(r, y.dim(-1)));
      total += r;
      continue;
    }
    x = Tensor();
    // The batch before must have left the next stage's queue: a slower
    // stage downstream would otherwise gather every batch of the split.
    if (b > 0) RETURN_IF_ERROR(AwaitEvalTaken(b - 1));
    Message out;
    out.kind = MessageKind::kActivation;
    out.step = kEvalStep;
    out.micro_batch = b;
    out.tensor = ForLink(downstream_, std::move(y));
    if (absl::Status s = downstream_->Send(std::move(out)); !s.ok())
      return AfterFailedSend(downstream_, s);
    ++sent;
  }
  if (!placement_.last()) {
    // Nothing of the evaluation may be left on the link for the next step.
    if (sent > 0) RETURN_IF_ERROR(AwaitEvalTaken(sent - 1));
    Message end;
    end.kind = MessageKind::kEvalEnd;
    end.step = kEvalStep;
    if (absl::Status s = downstream_->Send(std::move(end)); !s.ok())
      return AfterFailedSend(downstream_, s);
  }
  last_eval_peak_bytes_ = Counted().peak_bytes();
  return total;
}

}  // namespace gpipe
