#include "services/transport/link.h"

#include "absl/strings/str_cat.h"

namespace gpipe {

std::string Describe(const Message& m) {
  if (m.kind == MessageKind::kEvalEnd) return "end of evaluation";
  if (m.kind == MessageKind::kEvalFailed) {
    return absl::StrCat("failure of stage ", m.micro_batch,
                        "'s part of the evaluation");
  }
  if (m.kind == MessageKind::kEvalTaken) {
    return absl::StrCat("receipt of evaluation batch ", m.micro_batch);
  }
  if (m.kind == MessageKind::kReduceSlice) {
    return absl::StrCat(m.micro_batch == 0 ? "gradient slice"
                        : m.micro_batch == kReduceRowsPhase
                            ? "running statistics"
                            : "summed slice",
                        " at step ", m.step);
  }
  const char* kind = m.kind == MessageKind::kActivation ? "activation"
                     : m.kind == MessageKind::kGradient ? "gradient"
                                                        : "gradient norm";
  if (m.kind == MessageKind::kGradSquares)
    return absl::StrCat(kind, " at step ", m.step);
  return absl::StrCat(kind, " of micro-batch ", m.micro_batch,
                      m.step == kEvalStep ? std::string(" in evaluation")
                                          : absl::StrCat(" at step ", m.step));
}

}  // namespace gpipe
