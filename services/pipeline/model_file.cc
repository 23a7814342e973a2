#include "services/pipeline/model_file.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace gpipe {

std::map<std::string, std::string> ModelFileMetadata(
    const gpipe::v1::JobSpec& spec, int64_t steps) {
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(spec, &json);
  return {{"format", "pt"},
          {"gpipe.job", json},
          {"gpipe.step", absl::StrCat(steps)}};
}

}  // namespace gpipe
