// init_from: a job's starting weights read from a model or checkpoint file
// (or a directory of them) instead of drawn from the seed. Tensors are
// matched by global name ("layers.3.weight"), so the file may come from a
// run of any stage count; each stage loads its own layers and judges the
// names of its layers, and the last stage also the names that are no
// layer of the model, so every name in the file is judged exactly once.
#ifndef GPIPE_SERVICES_PIPELINE_INIT_WEIGHTS_H_
#define GPIPE_SERVICES_PIPELINE_INIT_WEIGHTS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/nn/model.h"
#include "services/tensor/tensor.h"

namespace gpipe {

struct InitWeights {
  std::string path;
  std::map<std::string, Tensor> tensors;  // every file's, on the host
  // Tensors of a dtype no model holds (F16, BF16, I64), name to dtype: an
  // error where the model has the name, else extras like any other.
  std::map<std::string, std::string> other_dtypes;
  // The step the weights were saved after ("step" of a checkpoint file,
  // "gpipe.step" of a model file); none when the file does not say.
  std::optional<int64_t> step;
};

// Reads a .safetensors file, or every *.safetensors file of a directory (a
// fetched checkpoint; a name in two files is an error). Errors name the
// path and start with "init_from.path: ".
absl::StatusOr<InitWeights> ReadInitWeights(const std::string& path);

// The range of layers one loader is responsible for.
struct LayerRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t model_layers = 0;  // of the whole model: end == it is the last
};

struct InitReport {
  int64_t loaded = 0;                // tensors copied
  std::vector<std::string> missing;  // kept from the seed (strict: error)
  std::vector<std::string> ignored;  // in the file, not in the model
  std::string ToString() const;
};

// Copies the file's tensors into `model` (and `optimizer` state when the
// spec asks) by name. A tensor of another shape or dtype is always an
// error; with strict (the default) so is any missing or extra tensor, all
// listed; optimizer state asked for and absent is an error. Nothing is
// copied unless everything checks. INVALID_ARGUMENT starting with
// "init_from".
absl::StatusOr<InitReport> LoadInitWeights(
    const InitWeights& weights, const gpipe::v1::InitFrom& spec,
    const std::vector<NamedTensor>& model,
    const std::vector<NamedTensor>& optimizer, const LayerRange& range);

// `weights` loaded into a whole model of `spec` (LoadInitWeights over all
// its layers).
absl::StatusOr<InitReport> LoadWholeModel(
    const InitWeights& weights, const gpipe::v1::JobSpec& spec,
    const std::vector<NamedTensor>& model,
    const std::vector<NamedTensor>& optimizer);

// ReadInitWeights(spec.init_from().path()) loaded into a whole model (its
// state and, when the spec asks, its optimizer's; `optimizer` may be empty
// for a model that only serves).
absl::StatusOr<InitReport> InitWholeModel(
    const gpipe::v1::JobSpec& spec, const std::vector<NamedTensor>& model,
    const std::vector<NamedTensor>& optimizer);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_INIT_WEIGHTS_H_
