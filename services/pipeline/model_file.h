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

// {"format": "pt", "gpipe.job": the spec as JSON, "gpipe.step": steps}.
std::map<std::string, std::string> ModelFileMetadata(
    const gpipe::v1::JobSpec& spec, int64_t steps);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_MODEL_FILE_H_
