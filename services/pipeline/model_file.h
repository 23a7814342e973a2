// The metadata of a final model file (model.safetensors), the same whether
// `gpipectl train` or the controller writes it, so the two files of the same
// run are byte for byte equal.
#ifndef GPIPE_SERVICES_PIPELINE_MODEL_FILE_H_
#define GPIPE_SERVICES_PIPELINE_MODEL_FILE_H_

#include <cstdint>
#include <map>
#include <string>

#include "gpipe/v1/job.pb.h"

namespace gpipe {

// The version of what follows; a reader refuses a file of a later one.
inline constexpr char kModelFormatVersionKey[] = "gpipe.format_version";
inline constexpr char kModelFormatVersion[] = "1";

// {"format": "pt", "gpipe.format_version": "1", "gpipe.job": the spec as
// JSON (with what the data filled in at submit), "gpipe.step": steps}, and
// when the data has them "gpipe.preprocessing" ({"normalize": {"mean": [..],
// "std": [..]}}: what the inputs went through before the first layer) and
// "gpipe.vocabulary" (a text model's byte for each token id, as a JSON list
// of numbers).
std::map<std::string, std::string> ModelFileMetadata(
    const gpipe::v1::JobSpec& spec, int64_t steps);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_MODEL_FILE_H_
