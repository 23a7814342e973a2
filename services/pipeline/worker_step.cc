#include "services/pipeline/worker_step.h"

#include "absl/strings/str_cat.h"
#include "services/core/status.h"

namespace gpipe {

absl::StatusOr<std::vector<StageStepResult>> RunWorkerStep(
    const std::vector<Stage*>& chunks, const std::vector<Op>& ops,
    int64_t step) {
  const int64_t v = static_cast<int64_t>(chunks.size());
  std::vector<StageStepResult> results(chunks.size());
  for (Stage* chunk : chunks) RETURN_IF_ERROR(chunk->BeginStep(step));
  for (const Op& op : ops) {
    if (op.kind != OpKind::kOptimizerStep) {
      if (op.chunk < 0 || op.chunk >= v) {
        return absl::InvalidArgumentError(absl::StrCat(
            "an op of chunk ", op.chunk, " on a worker of ", v, " chunks"));
      }
      RETURN_IF_ERROR(chunks[op.chunk]->RunOp(op));
      continue;
    }
    for (Stage* chunk : chunks) RETURN_IF_ERROR(chunk->SendGradSquares());
    for (int64_t c = v; c-- > 0;) {
      ASSIGN_OR_RETURN(results[c], chunks[c]->FinishStep());
    }
  }
  return results;
}

}  // namespace gpipe
