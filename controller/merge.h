// The final model of a job: every stage's safetensors file merged into one.
// Tensor names carry the global layer index ("layers.<i>.<param>"), so the
// stages' names are disjoint and the merged file loads like the reference
// trainer's.
#ifndef GPIPE_CONTROLLER_MERGE_H_
#define GPIPE_CONTROLLER_MERGE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace gpipe::controller {

// Reads each of `stage_paths` and writes all their tensors with `metadata`
// to `out_path` (atomically; its directory is created). A tensor name found
// in two stages is DataLoss, as is any unreadable stage file; each error
// names the file.
absl::Status MergeStageParameters(
    const std::vector<std::string>& stage_paths, const std::string& out_path,
    const std::map<std::string, std::string>& metadata);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_MERGE_H_
