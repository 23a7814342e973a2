#include "services/pipeline/model_file.h"

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"

namespace gpipe {
namespace {

// Floats as JSON numbers that read back to the same float32.
std::string FloatList(const google::protobuf::RepeatedField<float>& values) {
  return absl::StrCat("[",
                      absl::StrJoin(values, ", ",
                                    [](std::string* out, float v) {
                                      char buf[32];
                                      std::snprintf(buf, sizeof(buf), "%.9g",
                                                    v);
                                      out->append(buf);
                                    }),
                      "]");
}

}  // namespace

std::map<std::string, std::string> ModelFileMetadata(
    const gpipe::v1::JobSpec& spec, int64_t steps) {
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(spec, &json);
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {kModelFormatVersionKey, kModelFormatVersion},
      {"gpipe.job", json},
      {"gpipe.step", absl::StrCat(steps)}};
  const gpipe::v1::DataSpec& data = spec.data();
  if (data.has_normalize()) {
    metadata["gpipe.preprocessing"] = absl::StrCat(
        "{\"normalize\": {\"mean\": ", FloatList(data.normalize().mean()),
        ", \"std\": ", FloatList(data.normalize().std()), "}}");
  }
  if (data.has_text() && !data.text().vocabulary().empty()) {
    const std::string& bytes = data.text().vocabulary();
    metadata["gpipe.vocabulary"] = absl::StrCat(
        "[",
        absl::StrJoin(bytes, ", ",
                      [](std::string* out, char c) {
                        absl::StrAppend(out, static_cast<uint8_t>(c));
                      }),
        "]");
  }
  return metadata;
}

}  // namespace gpipe
