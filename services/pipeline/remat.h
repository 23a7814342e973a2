// Re-materialization (GPipe's activation checkpointing): which stages drop
// their internal activations after a forward and recompute them inside the
// backward, keeping only the stage's input per micro-batch.
#ifndef GPIPE_SERVICES_PIPELINE_REMAT_H_
#define GPIPE_SERVICES_PIPELINE_REMAT_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"

namespace gpipe {

enum class RematMode {
  kAlways,      // every stage recomputes
  kExceptLast,  // all but the last stage, whose backward follows at once
  kNever,       // keep everything (fastest, most memory)
};

inline bool StageRematerializes(RematMode mode, int64_t stage, int64_t k) {
  return mode == RematMode::kAlways ||
         (mode == RematMode::kExceptLast && stage != k - 1);
}

std::string_view RematName(RematMode mode);  // always, except_last, never
absl::StatusOr<RematMode> ParseRematName(std::string_view name);
RematMode RematFromSpec(gpipe::v1::Remat remat);  // unspecified: except_last
gpipe::v1::Remat RematToSpec(RematMode mode);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_REMAT_H_
