#include "services/pipeline/init_weights.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/pipeline/model_file.h"
#include "services/storage/manifest.h"
#include "services/storage/safetensors.h"

namespace gpipe {
namespace {

absl::Status InitError(absl::StatusCode code, const std::string& message) {
  return absl::Status(code, absl::StrCat("init_from.path: ", message));
}

// The step a file's metadata records, if any.
absl::StatusOr<std::optional<int64_t>> StepOf(
    const std::string& path, const std::map<std::string, std::string>& meta) {
  for (const char* key : {"step", "gpipe.step"}) {
    auto it = meta.find(key);
    if (it == meta.end()) continue;
    int64_t step = 0;
    if (!absl::SimpleAtoi(it->second, &step) || step < 0) {
      return InitError(absl::StatusCode::kInvalidArgument,
                       absl::StrCat(path, ": metadata ", key, " is \"",
                                    it->second, "\", not a step"));
    }
    return std::optional<int64_t>(step);
  }
  return std::optional<int64_t>();
}

// The layer index of "layers.<i>.<rest>", or -1 for any other name.
int64_t LayerOf(const std::string& name) {
  constexpr std::string_view kPrefix = "layers.";
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  const char* begin = name.data() + kPrefix.size();
  const char* end = name.data() + name.size();
  int64_t index = -1;
  const auto [at, ec] = std::from_chars(begin, end, index);
  if (ec != std::errc() || at == begin || at == end || *at != '.') return -1;
  return index;
}

// At most a dozen names, then how many more: an error must stay readable
// when a whole model is missing.
std::string NameList(const std::vector<std::string>& names) {
  constexpr size_t kShown = 12;
  std::vector<std::string> shown(
      names.begin(), names.begin() + std::min(names.size(), kShown));
  std::string list = absl::StrJoin(shown, ", ");
  if (names.size() > kShown) {
    absl::StrAppend(&list, " and ", names.size() - kShown, " more");
  }
  return list;
}

}  // namespace

std::string InitReport::ToString() const {
  std::string s = absl::StrCat("loaded ", loaded, " tensors");
  if (!missing.empty()) {
    absl::StrAppend(
        &s, "; kept from the seed (not in the file): ", NameList(missing));
  }
  if (!ignored.empty()) {
    absl::StrAppend(&s, "; ignored (not in the model): ", NameList(ignored));
  }
  return s;
}

absl::StatusOr<InitWeights> ReadInitWeights(const std::string& path) {
  std::error_code ec;
  std::vector<std::string> files;
  const std::string manifest_path =
      (std::filesystem::path(path) / storage::kManifestName).string();
  const bool directory = std::filesystem::is_directory(path, ec);
  if (directory && std::filesystem::exists(manifest_path, ec)) {
    // A committed checkpoint: its manifest says which files, and each is
    // checked against its digest and step before any is read (a flipped
    // bit, or a file of another checkpoint, trained on before).
    absl::StatusOr<gpipe::v1::CheckpointManifest> manifest =
        storage::ReadVerifiedManifest(manifest_path);
    if (!manifest.ok()) {
      return InitError(manifest.status().code(),
                       std::string(manifest.status().message()));
    }
    for (const gpipe::v1::CheckpointFile& file : manifest->files()) {
      files.push_back(storage::ManifestFilePath(manifest_path, file));
    }
  } else if (directory) {
    for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
      if (entry.path().extension() == ".safetensors") {
        files.push_back(entry.path().string());
      }
    }
    if (ec) {
      return InitError(absl::StatusCode::kFailedPrecondition,
                       absl::StrCat(path, ": cannot list: ", ec.message()));
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      return InitError(absl::StatusCode::kInvalidArgument,
                       absl::StrCat(path,
                                    ": the directory holds no "
                                    ".safetensors file"));
    }
  } else if (std::filesystem::exists(path, ec)) {
    files.push_back(path);
  } else {
    return InitError(absl::StatusCode::kNotFound,
                     absl::StrCat(path, ": no such file or directory"));
  }
  InitWeights weights;
  // Each tensor's file, to name both where a tensor is in two.
  std::map<std::string, std::string> first_file;
  weights.path = path;
  for (const std::string& file : files) {
    absl::StatusOr<SafetensorsFile> read =
        ReadSafetensors(file, storage::OtherDTypes::kSkip);
    if (!read.ok()) {
      // A file that is no safetensors file at all (a text file named by
      // mistake) is called that, as gpipectl eval calls it; its header
      // length read from text said nothing a user could act on.
      const absl::StatusOr<std::map<std::string, std::string>> header =
          ReadMetadata(file);
      if (!header.ok()) {
        return InitError(header.status().code(),
                         std::string(header.status().message()));
      }
      return InitError(
          read.status().code(),
          absl::StrCat(read.status().message(), OtherWeightsFormatHint(file)));
    }
    if (absl::Status v = CheckModelFormatVersion(file, read->metadata);
        !v.ok()) {
      return InitError(v.code(), std::string(v.message()));
    }
    ASSIGN_OR_RETURN(std::optional<int64_t> step, StepOf(file, read->metadata));
    if (step.has_value()) {
      if (weights.step.has_value() && *weights.step != *step) {
        return InitError(
            absl::StatusCode::kInvalidArgument,
            absl::StrCat(path, ": its files are of steps ", *weights.step,
                         " and ", *step, " (files of two checkpoints?)"));
      }
      weights.step = step;
    }
    for (const auto& [name, dtype] : read->other_dtypes)
      weights.other_dtypes[name] = dtype;
    for (auto& [name, tensor] : read->tensors) {
      // A NaN or an infinity in a weight poisons every step after it, and
      // the job would write it back out: refused here, as non-finite data
      // is.
      if (tensor.dtype() == DType::kF32) {
        const float* v = tensor.f32();
        for (int64_t i = 0; i < tensor.numel(); ++i) {
          if (!std::isfinite(v[i])) {
            return InitError(
                absl::StatusCode::kInvalidArgument,
                absl::StrCat(file, ": tensor ", name, " holds ", v[i],
                             " at element ", i, " (weights must be finite)"));
          }
        }
      }
      const auto [where, added] = first_file.emplace(name, file);
      if (!added) {
        return InitError(
            absl::StatusCode::kInvalidArgument,
            absl::StrCat(path, ": tensor ", name, " is in two files (",
                         where->second, " and ", file, ")"));
      }
      weights.tensors.emplace(name, std::move(tensor));
    }
  }
  return weights;
}

absl::StatusOr<InitReport> LoadInitWeights(
    const InitWeights& weights, const gpipe::v1::InitFrom& spec,
    const std::vector<NamedTensor>& model,
    const std::vector<NamedTensor>& optimizer, const LayerRange& range) {
  const bool strict = !spec.has_strict() || spec.strict();
  // The step is the file's (written into the spec at submit); one written
  // by hand that differs skipped steps, or repeated them, with their
  // learning rates, without a word.
  if (spec.optimizer_state() && spec.step() != 0 && weights.step.has_value() &&
      *weights.step != spec.step()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_from.step: ", spec.step(), " is not the step ", *weights.step,
        " that ", weights.path,
        " was saved after (leave init_from.step out: it is read from the "
        "file)"));
  }
  InitReport report;
  std::vector<std::pair<Tensor*, const Tensor*>> copies;
  std::set<std::string> known;  // names this loader takes
  std::vector<std::string> mismatched;
  const auto match = [&](const NamedTensor& t, bool required_here) {
    known.insert(t.name);
    auto it = weights.tensors.find(t.name);
    if (it == weights.tensors.end()) {
      if (auto other = weights.other_dtypes.find(t.name);
          other != weights.other_dtypes.end()) {
        mismatched.push_back(absl::StrCat(
            t.name, " is ", other->second, " in the file, ",
            AsAbsl(DTypeName(t.tensor->dtype())), " ",
            t.tensor->shape().ToString(), " in the model (convert it: ",
            t.tensor->dtype() == DType::kF32 ? "float32, .float()"
                                             : "int32, .int()",
            " in PyTorch)"));
        return;
      }
      if (required_here) report.missing.push_back(t.name);
      return;
    }
    const Tensor& from = it->second;
    if (from.dtype() != t.tensor->dtype() ||
        !(from.shape() == t.tensor->shape())) {
      mismatched.push_back(
          absl::StrCat(t.name, " is ", AsAbsl(DTypeName(from.dtype())), " ",
                       from.shape().ToString(), " in the file, ",
                       AsAbsl(DTypeName(t.tensor->dtype())), " ",
                       t.tensor->shape().ToString(), " in the model"));
      return;
    }
    copies.emplace_back(t.tensor, &from);
  };
  for (const NamedTensor& t : model) match(t, true);
  std::vector<std::string> no_state;
  if (spec.optimizer_state()) {
    for (const NamedTensor& t : optimizer) {
      if (weights.tensors.count(t.name) == 0) no_state.push_back(t.name);
      match(t, false);
    }
  }
  // Another optimizer's state of one of our tensors ("layers.0.weight.
  // momentum" for AdamW) is not foreign to the model: skipped silently
  // unless optimizer state was asked for.
  const auto state_of_ours = [&](const std::string& name) {
    for (const NamedTensor& t : model) {
      if (name.size() > t.name.size() &&
          name.compare(0, t.name.size(), t.name) == 0 &&
          name[t.name.size()] == '.') {
        return true;
      }
    }
    return false;
  };
  // Names of no layer of the model (a PyTorch state_dict's "0.weight")
  // every loader can tell apart; the last one reports them, the others
  // name them in their errors only, so a stage's refusal shows what the
  // file holds instead (the hint a missing "layers." prefix needs).
  std::vector<std::string> foreign;
  const auto judge = [&](const std::string& name) {
    const int64_t layer = LayerOf(name);
    const bool no_layer = layer < 0 || layer >= range.model_layers;
    const bool ours = (layer >= range.begin && layer < range.end) ||
                      (range.end == range.model_layers && no_layer);
    if (known.count(name) > 0) return;
    if (!spec.optimizer_state() && state_of_ours(name)) return;
    // PyTorch's BatchNorm counts its steps only for momentum=None, which we
    // do not have: a state_dict's counter is no mismatch, where `strict
    // false` to get past it would hide real ones.
    if (ours && absl::EndsWith(name, ".num_batches_tracked")) return;
    if (ours) {
      report.ignored.push_back(name);
    } else if (no_layer) {
      foreign.push_back(name);
    }
  };
  for (const auto& [name, tensor] : weights.tensors) judge(name);
  for (const auto& [name, dtype] : weights.other_dtypes) judge(name);
  std::sort(report.ignored.begin(), report.ignored.end());
  const std::string where = weights.path;
  if (!mismatched.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_from: ", where, ": ", mismatched.size(),
        mismatched.size() == 1 ? " tensor does not" : " tensors do not",
        " fit the model: ", absl::StrJoin(mismatched, "; ")));
  }
  if (!no_state.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_from.optimizer_state: ", where, " holds no optimizer state for ",
        NameList(no_state),
        " (a model file has none: continue from a checkpoint, fetched with "
        "`gpipectl fetch JOB --step N`, or set optimizer_state false)"));
  }
  if (strict && (!report.missing.empty() || !report.ignored.empty())) {
    std::string message =
        absl::StrCat("init_from: ", where, " does not match the model");
    const bool whole = range.begin == 0 && range.end == range.model_layers;
    if (!report.missing.empty()) {
      absl::StrAppend(&message, "; missing ", report.missing.size());
      if (!whole) {
        absl::StrAppend(&message, " of layers ", range.begin, "-",
                        range.end - 1, " (this stage's)");
      }
      absl::StrAppend(&message, ": ", NameList(report.missing));
    }
    std::vector<std::string> extra = report.ignored;
    extra.insert(extra.end(), foreign.begin(), foreign.end());
    if (!extra.empty()) {
      absl::StrAppend(&message, "; not in the model ", extra.size(), ": ",
                      NameList(extra));
    }
    // A PyTorch nn.Sequential's names are ours without "layers.".
    const bool unprefixed =
        std::any_of(extra.begin(), extra.end(), [&](const std::string& n) {
          return std::any_of(report.missing.begin(), report.missing.end(),
                             [&](const std::string& m) {
                               return m == absl::StrCat("layers.", n);
                             });
        });
    if (unprefixed) {
      absl::StrAppend(&message,
                      "; the file's names lack the \"layers.\" prefix of "
                      "the model's, as a PyTorch nn.Sequential's state_dict "
                      "does: add it (gpipe.from_torch does)");
    }
    absl::StrAppend(&message,
                    " (set init_from.strict false to load what matches)");
    return absl::InvalidArgumentError(message);
  }
  for (auto [to, from] : copies) to->CopyFrom(*from);
  report.loaded = static_cast<int64_t>(copies.size());
  return report;
}

absl::StatusOr<InitReport> LoadWholeModel(
    const InitWeights& weights, const gpipe::v1::JobSpec& spec,
    const std::vector<NamedTensor>& model,
    const std::vector<NamedTensor>& optimizer) {
  const int64_t layers = spec.model().layers_size();
  return LoadInitWeights(weights, spec.init_from(), model, optimizer,
                         LayerRange{0, layers, layers});
}

absl::StatusOr<InitReport> InitWholeModel(
    const gpipe::v1::JobSpec& spec, const std::vector<NamedTensor>& model,
    const std::vector<NamedTensor>& optimizer) {
  ASSIGN_OR_RETURN(const InitWeights weights,
                   ReadInitWeights(spec.init_from().path()));
  return LoadWholeModel(weights, spec, model, optimizer);
}

}  // namespace gpipe
