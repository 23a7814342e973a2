// OpenDataset: from a job's DataSpec to a Dataset, checking each field and
// prefixing errors with the field they concern.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "services/core/status.h"
#include "services/data/csv.h"
#include "services/data/dataset.h"
#include "services/data/fashion_mnist.h"
#include "services/data/normalize.h"
#include "services/data/synthetic.h"
#include "services/data/tensor_files.h"
#include "services/data/text.h"
#include "services/data/tokens.h"

namespace gpipe {
namespace {

// The same error, its message prefixed with where in the spec it arose. A
// message that starts with a field of that part of the spec ("path: ...",
// a field of CsvFile for "data.csv") continues its name: "data.csv.path:
// ...", as the spec's own checks write fields. Only a real field: a file
// named like one ("data.text.path: shouting: ...") stays apart.
absl::Status InField(const std::string& field, const absl::Status& s) {
  const absl::string_view message = s.message();
  const size_t colon = message.find(": ");
  bool names_field = false;
  if (colon != absl::string_view::npos && absl::StartsWith(field, "data.")) {
    const google::protobuf::FieldDescriptor* part =
        gpipe::v1::DataSpec::descriptor()->FindFieldByName(field.substr(5));
    names_field = part != nullptr && part->message_type() != nullptr &&
                  part->message_type()->FindFieldByName(
                      std::string(message.substr(0, colon))) != nullptr;
  }
  return absl::Status(s.code(),
                      absl::StrCat(field, names_field ? "." : ": ", message));
}

template <typename T>
absl::StatusOr<std::unique_ptr<Dataset>> Upcast(
    const std::string& field, absl::StatusOr<std::unique_ptr<T>> d) {
  if (!d.ok()) return InField(field, d.status());
  return std::unique_ptr<Dataset>(std::move(*d));
}

}  // namespace

namespace {

// The source alone, before data.normalize.
absl::StatusOr<std::unique_ptr<Dataset>> OpenSource(
    const gpipe::v1::DataSpec& spec, const Shape& model_input, uint64_t seed,
    DType model_dtype) {
  switch (spec.source_case()) {
    case gpipe::v1::DataSpec::kFashionMnist: {
      const std::string& dir = spec.fashion_mnist().dir();
      if (model_input.rank() > 0 &&
          model_input.numel() != FashionMnist::kPixels) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.fashion_mnist: images have 784 pixels but the model input ",
            model_input.ToString(), " holds ", model_input.numel()));
      }
      return Upcast(
          "data.fashion_mnist.dir",
          FashionMnist::Open(dir.empty() ? FashionMnist::kDefaultDir : dir,
                             model_input));
    }
    case gpipe::v1::DataSpec::kText: {
      const gpipe::v1::TextFile& text = spec.text();
      if (text.path().empty()) {
        return absl::InvalidArgumentError("data.text.path: required");
      }
      if (text.seq_len() <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.text.seq_len: must be positive, got ", text.seq_len()));
      }
      if (!(text.test_fraction() >= 0 && text.test_fraction() < 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.text.test_fraction: must be in [0, 1) (0 "
                         "means the default 0.1), got ",
                         text.test_fraction()));
      }
      // The vocabulary is the spec's, not the file's: its error named
      // data.text.path.
      const std::string& vocabulary = text.vocabulary();
      for (size_t i = 1; i < vocabulary.size(); ++i) {
        const int byte = static_cast<uint8_t>(vocabulary[i]);
        const int before = static_cast<uint8_t>(vocabulary[i - 1]);
        if (byte <= before) {
          return absl::InvalidArgumentError(absl::StrCat(
              "data.text.vocabulary: must hold distinct bytes in ascending "
              "order; byte ",
              byte, " follows ", before));
        }
      }
      return Upcast("data.text.path",
                    TextDataset::Open(text.path(), text.seq_len(),
                                      text.test_fraction(), vocabulary));
    }
    case gpipe::v1::DataSpec::kTokens: {
      const gpipe::v1::TokenFile& t = spec.tokens();
      TokenFileOptions o;
      o.path = t.path();
      o.test_path = t.test_path();
      o.bytes_per_id = t.dtype() == gpipe::v1::UINT32 ? 4 : 2;
      o.seq_len = t.seq_len();
      o.test_fraction = t.test_fraction();
      o.header_bytes = t.header_bytes();
      return Upcast("data.tokens", TokenDataset::Open(o));
    }
    case gpipe::v1::DataSpec::kTensors:
      return Upcast(
          "data.tensors",
          TensorFilesDataset::Open(spec.tensors(), model_input, model_dtype));
    case gpipe::v1::DataSpec::kCsv: {
      absl::StatusOr<std::unique_ptr<CsvDataset>> csv =
          CsvDataset::Open(spec.csv());
      if (csv.ok() && !spec.csv().feature_columns().empty() &&
          !std::equal((*csv)->feature_names().begin(),
                      (*csv)->feature_names().end(),
                      spec.csv().feature_columns().begin(),
                      spec.csv().feature_columns().end())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.csv.path: ", spec.csv().path(), ": its feature columns (",
            absl::StrJoin((*csv)->feature_names(), ", "),
            ") are not those recorded in data.csv.feature_columns (",
            absl::StrJoin(spec.csv().feature_columns(), ", "), ")"));
      }
      return Upcast("data.csv", std::move(csv));
    }
    case gpipe::v1::DataSpec::kSynthetic: {
      // MakeSynthetic's messages start with the field inside Synthetic.
      auto d = MakeSynthetic(spec.synthetic(), seed);
      if (!d.ok()) {
        return absl::Status(
            d.status().code(),
            absl::StrCat("data.synthetic.", d.status().message()));
      }
      return d;
    }
    case gpipe::v1::DataSpec::SOURCE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("data: no source set");
}

// A sample must fill the model's input exactly: each is gathered as the
// source's values and the first layer reads the model input's count of
// them, so a CSV of 4 feature columns under a model input of [3] wrote
// past the batch (a worker's segmentation fault) and under [400] read
// past it (a loss of 4e17).
absl::Status CheckSampleFillsInput(const gpipe::v1::DataSpec& spec,
                                   const Dataset& data,
                                   const Shape& model_input) {
  const Shape sample = data.input_shape();
  if (model_input.rank() == 0 || sample.numel() == model_input.numel()) {
    return absl::OkStatus();
  }
  if (spec.has_csv()) {
    const auto& csv = static_cast<const CsvDataset&>(data);
    return absl::InvalidArgumentError(absl::StrCat(
        "data.csv.path: ", spec.csv().path(), " has ", sample.numel(),
        " feature columns (", absl::StrJoin(csv.feature_names(), ", "),
        "), but the model input ", model_input.ToString(), " takes ",
        model_input.numel(),
        " values (model.input.shape and the first "
        "layer's inputs must be ",
        sample.numel(), ")"));
  }
  // A sequence's length is the spec's own field: name it.
  const std::string field = spec.has_text()     ? "data.text.seq_len"
                            : spec.has_tokens() ? "data.tokens.seq_len"
                                                : "data";
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": a sample is ", sample.ToString(), " (",
                   sample.numel(), " values), but the model input ",
                   model_input.ToString(), " takes ", model_input.numel(),
                   field == "data" || sample.numel() < model_input.numel()
                       ? ""
                       : " (model.input.shape and the embedding's "
                         "max_positions must cover seq_len)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(
    const gpipe::v1::DataSpec& spec, const Shape& model_input, uint64_t seed,
    DType model_dtype) {
  ASSIGN_OR_RETURN(std::unique_ptr<Dataset> data,
                   OpenSource(spec, model_input, seed, model_dtype));
  RETURN_IF_ERROR(CheckSampleFillsInput(spec, *data, model_input));
  gpipe::v1::Normalize normalize = spec.normalize();
  // Standardization not yet written into the spec (a job opened where it
  // was not submitted): the same statistics, computed here.
  if (spec.has_csv() && spec.csv().standardize() && !spec.has_normalize()) {
    normalize = static_cast<const CsvDataset&>(*data)
                    .ComputeStandardization()
                    .AsNormalize();
  }
  if (normalize.mean_size() == 0 && normalize.std_size() == 0) return data;
  return Upcast("data.normalize", Normalized(std::move(data), normalize));
}

}  // namespace gpipe
