#include "services/pipeline/content_check.h"

#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "services/core/status.h"
#include "services/data/dataset.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/data_resolution.h"
#include "services/pipeline/init_weights.h"
#include "services/pipeline/job_spec.h"
#include "services/tensor/tensor.h"

namespace gpipe {
namespace {

// A regular file's size, or the .safetensors files' of a folder; 0 for
// anything else (a FIFO, a device: the check refuses those on opening,
// without reading them).
int64_t BytesAt(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (ec) return 0;
  if (std::filesystem::is_regular_file(status)) {
    const uintmax_t size = std::filesystem::file_size(path, ec);
    return ec ? 0 : static_cast<int64_t>(size);
  }
  if (!std::filesystem::is_directory(status)) return 0;
  int64_t bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    if (entry.path().extension() == ".safetensors") {
      bytes += BytesAt(entry.path().string());
    }
  }
  return bytes;
}

// Whether the job's data comes from files of its own (not the built-in
// Fashion-MNIST files, not synthetic samples).
bool DataHasOwnFiles(const gpipe::v1::JobSpec& spec) {
  for (const auto& [field, path] : SpecPaths(spec)) {
    const std::string_view f = field;
    if (f != "init_from.path" && f != "data.fashion_mnist.dir") return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::optional<int64_t>> ContentCheckBytes(
    const gpipe::v1::JobSpec& spec) {
  const bool data = DataHasOwnFiles(spec);
  if (!data && !spec.has_init_from()) return std::nullopt;
  // A data file is held as read and as converted: a uint8 array's bytes
  // and four more for each as floats (CSV text takes less).
  constexpr int64_t kDecoded = 5;
  int64_t bytes = 0;
  for (const auto& [field, path] : SpecPaths(spec)) {
    const std::string_view f = field;
    if (f == "init_from.path") {
      bytes += BytesAt(path);
    } else if (data) {
      bytes += kDecoded * BytesAt(path);
    }
  }
  if (spec.has_init_from()) {
    ASSIGN_OR_RETURN(const ModelShapes shapes, InferModelShapes(spec.model()));
    int64_t state = 0;
    for (const LayerCost& cost : shapes.costs) {
      state += cost.param_bytes + cost.buffer_bytes;
    }
    // The model, and Adam's two moments at most for the optimizer's state.
    bytes += 3 * state;
  }
  return bytes;
}

std::vector<std::string> OptimizerStateNames(
    const gpipe::v1::OptimizerSpec& optimizer, const std::string& parameter) {
  switch (optimizer.kind_case()) {
    case gpipe::v1::OptimizerSpec::kSgd:
      if (optimizer.sgd().momentum() > 0) return {parameter + ".momentum"};
      return {};
    case gpipe::v1::OptimizerSpec::kAdamw:
      return {parameter + ".exp_avg", parameter + ".exp_avg_sq"};
    case gpipe::v1::OptimizerSpec::KIND_NOT_SET:
      break;
  }
  return {};
}

absl::Status CheckInitWeights(const gpipe::v1::JobSpec& spec,
                              const InitWeights& weights) {
  // Tensors of the model's and the optimizer's shapes to load into, as a
  // stage would (the controller builds no layers: ModelStateShapes).
  ASSIGN_OR_RETURN(const std::vector<StateShape> shapes,
                   ModelStateShapes(spec.model()));
  std::deque<Tensor> tensors;
  std::vector<NamedTensor> model, optimizer;
  for (const StateShape& s : shapes) {
    model.push_back({s.name, &tensors.emplace_back(Tensor::Zeros(s.shape))});
    if (!s.parameter) continue;
    for (std::string& name : OptimizerStateNames(spec.optimizer(), s.name)) {
      optimizer.push_back(
          {std::move(name), &tensors.emplace_back(Tensor::Zeros(s.shape))});
    }
  }
  return LoadWholeModel(weights, spec, model, optimizer).status();
}

absl::Status CheckStartingWeights(const gpipe::v1::JobSpec& spec) {
  if (!spec.has_init_from()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const InitWeights weights,
                   ReadInitWeights(spec.init_from().path()));
  return CheckInitWeights(spec, weights);
}

absl::Status CheckJobContents(const gpipe::v1::JobSpec& spec) {
  if (DataHasOwnFiles(spec)) RETURN_IF_ERROR(OpenJobDataset(spec).status());
  return CheckStartingWeights(spec);
}

}  // namespace gpipe
