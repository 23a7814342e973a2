#include "services/storage/checkpoint_layout.h"

#include <filesystem>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gpipe::storage {
namespace {

constexpr absl::string_view kStepPrefix = "step-";
constexpr absl::string_view kStageInfix = "-stage-";
constexpr absl::string_view kStageSuffix = ".safetensors";

std::string Join(absl::string_view dir, absl::string_view name) {
  return (std::filesystem::path(std::string(dir)) / std::string(name)).string();
}

// A number as we print it: digits only, no leading zero unless it is "0".
std::optional<int64_t> ParseCanonical(absl::string_view text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return std::nullopt;
    }
  }
  if (text.size() > 1 && text[0] == '0') return std::nullopt;
  int64_t n = 0;
  if (!absl::SimpleAtoi(text, &n)) return std::nullopt;
  return n;
}

}  // namespace

std::string JobCheckpointDir(absl::string_view root, absl::string_view job_id) {
  return Join(root, job_id);
}

std::string CheckpointStepDir(absl::string_view job_dir, int64_t step) {
  return Join(job_dir, absl::StrCat(kStepPrefix, step));
}

std::string FinalParametersDir(absl::string_view job_dir) {
  return Join(job_dir, "final");
}

std::string MergedModelPath(absl::string_view job_dir) {
  return Join(job_dir, "model.safetensors");
}

std::string ModelDigestPath(absl::string_view model_path) {
  return absl::StrCat(model_path, ".sha256");
}

std::string StageFileName(int64_t epoch, int64_t stage) {
  return absl::StrCat("e", epoch, kStageInfix, stage, kStageSuffix);
}

std::string StageFilePath(absl::string_view dir, int64_t epoch, int64_t stage) {
  return Join(dir, StageFileName(epoch, stage));
}

std::optional<StageFileId> ParseStageFileName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "e") ||
      !absl::ConsumeSuffix(&name, kStageSuffix)) {
    return std::nullopt;
  }
  const size_t infix = name.find(kStageInfix);
  if (infix == absl::string_view::npos) return std::nullopt;
  std::optional<int64_t> epoch = ParseCanonical(name.substr(0, infix));
  std::optional<int64_t> stage =
      ParseCanonical(name.substr(infix + kStageInfix.size()));
  if (!epoch || !stage) return std::nullopt;
  return StageFileId{*epoch, *stage};
}

std::optional<int64_t> ParseCheckpointStepDirName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kStepPrefix)) return std::nullopt;
  std::optional<int64_t> step = ParseCanonical(name);
  if (!step || *step <= 0) return std::nullopt;
  return step;
}

}  // namespace gpipe::storage
