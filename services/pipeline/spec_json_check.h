#ifndef GPIPE_SERVICES_PIPELINE_SPEC_JSON_CHECK_H_
#define GPIPE_SERVICES_PIPELINE_SPEC_JSON_CHECK_H_

#include <string_view>

#include "absl/status/status.h"

namespace gpipe {

// What protobuf's JSON parser takes without a word and so must be refused
// before it: a null list entry (dropped: a null layer vanished and the model
// trained with its other layers' indices shifted) and a key given twice in
// one object (the last value won, the first was dropped: a spec's "lr" set
// twice trained with whichever came second). A field's two spellings,
// "batch_size" and "batchSize", are one key. The error names the line and
// column. Anything else malformed is left for the parser to name.
absl::Status CheckSpecJsonStructure(std::string_view json);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_SPEC_JSON_CHECK_H_
