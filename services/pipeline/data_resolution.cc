#include "services/pipeline/data_resolution.h"

#include <filesystem>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/data/csv.h"
#include "services/data/dataset.h"
#include "services/data/text.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/init_weights.h"
#include "services/pipeline/model_file.h"

namespace gpipe {
namespace {

namespace v1 = ::gpipe::v1;

// Calls fn(field, &path) on every path field the spec sets: one list, so
// resolving, listing and checking paths cannot disagree.
template <typename Fn>
void VisitPaths(v1::JobSpec* spec, Fn fn) {
  const auto visit = [&](const char* field, std::string* path) {
    if (!path->empty()) fn(field, path);
  };
  v1::DataSpec& d = *spec->mutable_data();
  switch (d.source_case()) {
    case v1::DataSpec::kFashionMnist:
      visit("data.fashion_mnist.dir", d.mutable_fashion_mnist()->mutable_dir());
      break;
    case v1::DataSpec::kText:
      visit("data.text.path", d.mutable_text()->mutable_path());
      break;
    case v1::DataSpec::kTokens:
      visit("data.tokens.path", d.mutable_tokens()->mutable_path());
      visit("data.tokens.test_path", d.mutable_tokens()->mutable_test_path());
      break;
    case v1::DataSpec::kTensors: {
      v1::TensorFiles& t = *d.mutable_tensors();
      visit("data.tensors.inputs", t.mutable_inputs());
      visit("data.tensors.targets", t.mutable_targets());
      visit("data.tensors.test_inputs", t.mutable_test_inputs());
      visit("data.tensors.test_targets", t.mutable_test_targets());
      break;
    }
    case v1::DataSpec::kCsv:
      visit("data.csv.path", d.mutable_csv()->mutable_path());
      visit("data.csv.test_path", d.mutable_csv()->mutable_test_path());
      break;
    case v1::DataSpec::kSynthetic:
    case v1::DataSpec::SOURCE_NOT_SET:
      break;
  }
  if (spec->has_init_from()) {
    visit("init_from.path", spec->mutable_init_from()->mutable_path());
  }
}

bool HasEmbeddingToSize(const v1::ModelSpec& model) {
  return model.layers_size() > 0 && model.layers(0).has_embedding() &&
         model.layers(0).embedding().vocab_size() == 0;
}

bool HasHeadToSize(const v1::ModelSpec& model) {
  return model.layers_size() > 0 &&
         model.layers(model.layers_size() - 1).has_linear() &&
         model.layers(model.layers_size() - 1).linear().out_features() == 0;
}

bool NeedsInitStep(const v1::JobSpec& spec) {
  return spec.has_init_from() && spec.init_from().optimizer_state() &&
         spec.init_from().step() == 0;
}

bool NeedsStandardization(const v1::DataSpec& data) {
  return data.has_csv() && data.csv().standardize() && !data.has_normalize();
}

}  // namespace

absl::Status AdoptInitFromPreprocessing(v1::JobSpec* spec) {
  if (!spec->has_init_from() || spec->init_from().path().empty()) {
    return absl::OkStatus();
  }
  // The stored spec as it ran (a model file's, or a fetched checkpoint's
  // manifest's): RecordedJobSpec resolves nothing of it, so a file naming
  // itself (a model trained on in place) reads once. A checkpoint's ids
  // shifted under its embedding when it recorded none.
  absl::StatusOr<std::optional<v1::JobSpec>> recorded =
      RecordedJobSpec(spec->init_from().path());
  if (!recorded.ok()) {
    return absl::Status(
        recorded.status().code(),
        absl::StrCat("init_from.path: ", recorded.status().message()));
  }
  if (!recorded->has_value()) return absl::OkStatus();  // weights alone
  const v1::DataSpec& trained = (*recorded)->data();
  v1::DataSpec& data = *spec->mutable_data();
  if (data.has_text() && data.text().vocabulary().empty() &&
      trained.has_text() && !trained.text().vocabulary().empty()) {
    data.mutable_text()->set_vocabulary(trained.text().vocabulary());
  }
  if (data.has_csv() && data.csv().feature_columns().empty() &&
      trained.has_csv()) {
    *data.mutable_csv()->mutable_feature_columns() =
        trained.csv().feature_columns();
  }
  if (!data.has_normalize() && trained.has_normalize()) {
    *data.mutable_normalize() = trained.normalize();
    if (data.has_csv()) data.mutable_csv()->set_standardize(false);
  }
  return absl::OkStatus();
}

std::vector<DataDependentField> DataDependentFields(const v1::JobSpec& spec) {
  std::vector<DataDependentField> fields;
  const v1::ModelSpec& model = spec.model();
  if (HasEmbeddingToSize(model)) {
    fields.push_back({"model.layers[0].embedding.vocab_size", true});
  }
  if (HasHeadToSize(model)) {
    fields.push_back({absl::StrCat("model.layers[", model.layers_size() - 1,
                                   "].linear.out_features"),
                      true});
  }
  if (NeedsStandardization(spec.data())) {
    fields.push_back({"data.csv.standardize", true,
                      "data.normalize (each feature's mean and std)"});
  }
  if (spec.data().has_text() && spec.data().text().vocabulary().empty()) {
    fields.push_back({"data.text.vocabulary", false});
  }
  if (spec.data().has_csv() && spec.data().csv().feature_columns().empty()) {
    fields.push_back({"data.csv.feature_columns", false});
  }
  if (NeedsInitStep(spec)) fields.push_back({"init_from.step", true});
  return fields;
}

absl::Status ResolveDataDependentFields(v1::JobSpec* spec,
                                        std::vector<FilledSize>* filled) {
  if (NeedsInitStep(*spec)) {
    ASSIGN_OR_RETURN(const InitWeights weights,
                     ReadInitWeights(spec->init_from().path()));
    if (!weights.step.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init_from.optimizer_state: ", weights.path,
          " records no step to continue from (its metadata has neither "
          "\"step\" nor \"gpipe.step\")"));
    }
    if (*weights.step == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init_from.optimizer_state: ", weights.path,
          " was saved at step 0: there is no optimizer state to continue "
          "from (set optimizer_state false)"));
    }
    if (*weights.step >= spec->steps()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "steps: ", spec->steps(), " must be more than the step ",
          *weights.step, " that init_from.path ", weights.path,
          " continues from (steps counts from the start of that run)"));
    }
    spec->mutable_init_from()->set_step(*weights.step);
  }
  const std::vector<DataDependentField> fields = DataDependentFields(*spec);
  if (fields.empty()) return absl::OkStatus();
  // The data is read for the model's input: dims of -3 read as "the model
  // input [-3] takes -3 values".
  RETURN_IF_ERROR(CheckModelInput(spec->model()));
  // The source as it is on disk: statistics are of the raw features.
  v1::DataSpec raw = spec->data();
  raw.clear_normalize();
  if (raw.has_csv()) raw.mutable_csv()->set_standardize(false);
  const v1::TensorHeader& input = spec->model().input();
  const auto& dims = input.shape().dims();
  ASSIGN_OR_RETURN(
      std::unique_ptr<Dataset> data,
      OpenDataset(raw, Shape(std::vector<int64_t>(dims.begin(), dims.end())),
                  spec->seed(),
                  input.dtype() == v1::INT32 ? DType::kI32 : DType::kF32));
  const int64_t classes = data->num_classes();
  v1::ModelSpec& model = *spec->mutable_model();
  const auto note = [&](int64_t layer, const std::string& what) {
    if (filled == nullptr) return;
    const std::string name = absl::StrCat("model.layers[", layer, "]");
    filled->push_back({name, absl::StrCat(name, what)});
  };
  // A size past every value the data holds (and past 65,536) is a misread,
  // not a model: a uint16 token file declared UINT32 filled a vocabulary of
  // 3.2 million (11.5 GB, 1 sample/s), one stray label of 50,000,000 a head
  // of 40 GB, without a word. The user who means it writes the size.
  const int64_t samples = data->size(Split::kTrain) + data->size(Split::kTest);
  const auto past_the_data = [&](const std::string& field, int64_t size,
                                 const Shape& per_sample,
                                 const std::string& what) -> absl::Status {
    // Synthetic data's sizes are the spec's own numbers, not values read.
    if (spec->data().has_synthetic()) return absl::OkStatus();
    const int64_t values = samples * std::max<int64_t>(1, per_sample.numel());
    if (size <= std::max<int64_t>(values, int64_t{1} << 16))
      return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": 0 would be filled as ", size, " from the data's largest ",
        what, " ", size - 1, ", more than the ", values, " ", what,
        "s the data holds: most could never occur (is the data read as it "
        "was written: its dtype, its label column?); write the size to "
        "mean it"));
  };
  if (HasEmbeddingToSize(model)) {
    RETURN_IF_ERROR(past_the_data("model.layers[0].embedding.vocab_size",
                                  data->num_input_ids(), data->input_shape(),
                                  "token id"));
    model.mutable_layers(0)->mutable_embedding()->set_vocab_size(
        data->num_input_ids());
    note(0, absl::StrCat(".embedding.vocab_size ", data->num_input_ids(),
                         " was filled from the data: its largest token id is ",
                         data->num_input_ids() - 1));
  }
  if (HasHeadToSize(model)) {
    RETURN_IF_ERROR(
        past_the_data(absl::StrCat("model.layers[", model.layers_size() - 1,
                                   "].linear.out_features"),
                      classes, data->target_shape(), "class id"));
    model.mutable_layers(model.layers_size() - 1)
        ->mutable_linear()
        ->set_out_features(classes);
    note(model.layers_size() - 1,
         absl::StrCat(".linear.out_features ", classes,
                      " was filled from the data: its largest class id is ",
                      classes - 1));
  }
  if (spec->data().has_csv()) {
    const auto* csv = dynamic_cast<const CsvDataset*>(data.get());
    if (csv == nullptr) {
      return absl::InternalError("a csv source opened as another");
    }
    if (spec->data().csv().feature_columns().empty()) {
      spec->mutable_data()->mutable_csv()->mutable_feature_columns()->Assign(
          csv->feature_names().begin(), csv->feature_names().end());
    }
    if (NeedsStandardization(spec->data())) {
      *spec->mutable_data()->mutable_normalize() =
          csv->ComputeStandardization().AsNormalize();
    }
  }
  if (spec->data().has_text() && spec->data().text().vocabulary().empty()) {
    const auto* text = dynamic_cast<const TextDataset*>(data.get());
    if (text == nullptr)
      return absl::InternalError("a text source opened as another");
    spec->mutable_data()->mutable_text()->set_vocabulary(
        std::string(text->vocabulary().begin(), text->vocabulary().end()));
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::string>> SpecPaths(
    const v1::JobSpec& spec) {
  std::vector<std::pair<std::string, std::string>> paths;
  v1::JobSpec copy = spec;
  VisitPaths(&copy, [&](const char* field, std::string* path) {
    paths.emplace_back(field, *path);
  });
  return paths;
}

void ResolveDataPaths(const std::string& base, v1::JobSpec* spec) {
  VisitPaths(spec, [&](const char*, std::string* path) {
    if (std::filesystem::path(*path).is_absolute()) return;
    *path = (std::filesystem::path(base) / *path).lexically_normal().string();
  });
}

absl::Status CheckSpecPathsExist(const v1::JobSpec& spec) {
  for (const auto& [field, path] : SpecPaths(spec)) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": ", path, " does not exist",
        ec ? absl::StrCat(" (", ec.message(), ")") : std::string()));
  }
  return absl::OkStatus();
}

}  // namespace gpipe
