// gpipectl predict MODEL.safetensors INPUT: a classifier's classes for the
// samples of an .npy array, a CSV table or an image (PNG, JPEG, PGM), read and
// scaled as the model's training data was, then normalized as its file says.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "services/core/status.h"
#include "services/data/array_dataset.h"
#include "services/data/csv_cells.h"
#include "services/data/image_file.h"
#include "services/data/normalize.h"
#include "services/data/npy.h"
#include "services/data/numeric_array.h"
#include "services/nn/layer_spec.h"
#include "services/nn/model.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/init_weights.h"
#include "services/pipeline/model_file.h"
#include "services/storage/file_io.h"
#include "services/storage/safetensors_header.h"

ABSL_FLAG(int64_t, top, 3, "predict: the most likely classes shown per sample");
ABSL_FLAG(std::string, csv_header, "auto",
          "predict: whether a CSV's first row is its header: auto (a row "
          "of numbers is data, unless its cells are the model's feature "
          "names, as years or pandas' 0, 1, ... are), yes or no");
ABSL_FLAG(std::string, logits, "",
          "predict: also write every sample's scores, the model's outputs "
          "before the softmax, bit for bit to this file as a float32 .npy "
          "of [samples, classes]");
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(int64_t, stages);

namespace gpipe::cli {
namespace {

namespace v1 = ::gpipe::v1;

// Every error in the served model's words (ServedModelError): the user
// wrote no init_from.
int Fail(const absl::Status& status) {
  return FailCommand("predict", ServedModelError(status));
}

constexpr const char* kFashionClasses[] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

// The samples of INPUT as values of the model's input, before
// data.normalize: [N * sample] and N.
struct Samples {
  std::vector<float> values;
  std::vector<int32_t> ids;  // for a model of int32 input
  int64_t count = 0;
};

// One sample (as many values as the model's input), or [N, ...] whose
// samples each have that many, as training takes them: an array of (200, 5)
// for an input of 4 values was read as 250 samples.
absl::StatusOr<int64_t> CountOf(const NumericArray& array, int64_t sample,
                                const std::string& path) {
  const int64_t numel = array.numel();
  if (numel == sample) return 1;
  int64_t per = 1;
  for (size_t d = 1; d < array.shape.size(); ++d) per *= array.shape[d];
  if (array.shape.size() >= 2 && per == sample && array.shape[0] > 0) {
    return array.shape[0];
  }
  if (numel == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": an array of ", ShapeToString(array.shape),
                     " holds no samples: nothing to predict"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": an array of ", ShapeToString(array.shape),
      " is neither one sample nor [N, ...] samples of the model's input of ",
      sample, " values"));
}

absl::StatusOr<Samples> ReadNpySamples(const std::string& path,
                                       const v1::JobSpec& spec,
                                       int64_t sample) {
  ASSIGN_OR_RETURN(const NumericArray array, ReadNpy(path));
  Samples s;
  ASSIGN_OR_RETURN(s.count, CountOf(array, sample, path));
  // The conversions' errors name the element; the file is named here.
  const auto in_file = [&](const absl::Status& e) {
    return absl::Status(e.code(), absl::StrCat(path, ": ", e.message()));
  };
  if (spec.model().input().dtype() == v1::INT32) {
    absl::StatusOr<std::vector<int32_t>> ids = ToInt32(array, "token ids");
    if (!ids.ok()) return in_file(ids.status());
    s.ids = std::move(*ids);
    return s;
  }
  absl::StatusOr<std::vector<float>> values = ToFloat32(array);
  if (!values.ok()) return in_file(values.status());
  s.values = std::move(*values);
  // Bytes of an image, as Fashion-MNIST's files hold them: scaled as the
  // dataset scales them.
  if (spec.data().has_fashion_mnist() && array.type == ElementType::kU8) {
    for (float& v : s.values) v = v / 255.0f;
  } else if (spec.data().has_fashion_mnist() && !s.values.empty()) {
    // Pixels of another type are taken as they are: 0-255 as floats read
    // 255 times too bright, and every answer came out certain.
    const float largest = *std::max_element(s.values.begin(), s.values.end());
    // Far past any pixel / 255, even standardized (about 2 at most).
    if (largest > 10.0f) {
      std::fprintf(stderr,
                   "gpipectl predict: warning: %s holds values up to %g, but "
                   "the model was trained on Fashion-MNIST pixels scaled to "
                   "[0, 1]: divide them by 255, or give the bytes as a uint8 "
                   "array (scaled for you)\n",
                   path.c_str(), largest);
    }
  }
  return s;
}

absl::StatusOr<Samples> ReadCsvSamples(const std::string& path,
                                       const v1::JobSpec& spec,
                                       int64_t sample) {
  ASSIGN_OR_RETURN(const std::string read, storage::ReadWholeFile(path));
  absl::string_view text = read;
  // As training reads a table (services/data/csv.cc): a spreadsheet's byte
  // order mark is not a cell, blank lines may end the table but not break
  // it (a skipped one would shift every later line number).
  if (absl::StartsWith(text, "\xEF\xBB\xBF")) text.remove_prefix(3);
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  while (!lines.empty() && absl::StripAsciiWhitespace(lines.back()).empty()) {
    lines.pop_back();
  }
  const char delimiter =
      spec.data().has_csv() && !spec.data().csv().delimiter().empty()
          ? spec.data().csv().delimiter()[0]
          : ',';
  const auto& names = spec.data().csv().feature_columns();
  // A table trained without a header names its features by their column
  // numbers (from 0): rows laid out as that table was are read by them.
  const bool trained_with_header = !spec.data().has_csv() ||
                                   !spec.data().csv().has_header() ||
                                   spec.data().csv().header();
  std::vector<int64_t> by_number;
  if (!trained_with_header) {
    for (const std::string& name : names) {
      int64_t c = 0;
      if (!absl::SimpleAtoi(name, &c) || c < 0) {
        by_number.clear();
        break;
      }
      by_number.push_back(c);
    }
  }
  std::vector<int64_t> pick;        // column of each feature, by the header
  std::vector<std::string> header;  // its names, when the table has one
  const auto number_of = [](absl::string_view cell, float* v) {
    return absl::SimpleAtof(absl::StripAsciiWhitespace(cell), v) &&
           std::isfinite(*v);
  };
  const auto delimiter_name = [](char d) {
    return d == '\t' ? std::string("tab")
                     : absl::StrCat("'", std::string(1, d), "'");
  };
  CsvLineSplitter splitter(delimiter);
  Samples s;
  for (int64_t number = 1; number <= static_cast<int64_t>(lines.size());
       ++number) {
    absl::string_view line = lines[number - 1];
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": ", what));
    };
    if (absl::StripAsciiWhitespace(line).empty()) return error("empty line");
    // Quoted cells as training reads them (services/data/csv_cells.h).
    std::vector<std::string_view> split;
    if (absl::Status cut =
            splitter.Split(std::string_view(line.data(), line.size()), &split);
        !cut.ok()) {
      return error(cut.message());
    }
    std::vector<absl::string_view> cells;
    for (std::string_view c : split) cells.emplace_back(c.data(), c.size());
    if (number == 1) {
      float v = 0;
      const bool numbers = std::all_of(
          cells.begin(), cells.end(),
          [&](absl::string_view cell) { return number_of(cell, &v); });
      std::vector<std::string> first;
      for (absl::string_view c : cells)
        first.emplace_back(absl::StripAsciiWhitespace(c));
      // Names that are numbers (years, ids, pandas' 0, 1, ...) make a
      // header of numbers: a first row whose cells are the feature names
      // (with the target's, as the training file's header) is one, and
      // said so, since a row of data could read the same.
      const std::string mode = absl::GetFlag(FLAGS_csv_header);
      std::vector<std::string> want(names.begin(), names.end());
      std::vector<std::string> cells_sorted = first;
      std::sort(want.begin(), want.end());
      std::sort(cells_sorted.begin(), cells_sorted.end());
      std::vector<std::string> with_target = want;
      with_target.push_back(spec.data().csv().target());
      std::sort(with_target.begin(), with_target.end());
      const bool names_the_features =
          trained_with_header && !names.empty() &&
          (cells_sorted == want || cells_sorted == with_target);
      const bool is_header =
          mode == "yes" || (mode == "auto" && (!numbers || names_the_features));
      if (mode == "auto" && numbers && names_the_features) {
        std::fprintf(stderr,
                     "gpipectl predict: %s: the first row's numbers are the "
                     "model's feature names: read as the header "
                     "(--csv-header no reads it as data)\n",
                     path.c_str());
      }
      // One cell where the model takes several: most likely the row's
      // cells are separated by another delimiter than the training data's.
      std::string hint;
      if (cells.size() == 1 && names.size() > 1) {
        hint = absl::StrCat(
            " (the model reads tables whose cells are "
            "separated by ",
            delimiter_name(delimiter), ", as its training data's were)");
      }
      if (is_header && !trained_with_header) {
        return error(absl::StrCat(
            "the model was trained on a table without a header (its "
            "features are columns ",
            absl::StrJoin(names, ", "),
            ", counted from 0): give rows of numbers, laid out as that "
            "table's or of its ",
            names.size(), " features alone", hint));
      }
      if (is_header) {
        // A header: find the model's features by name when it knows them.
        header = std::move(first);
        for (const std::string& name : names) {
          const auto at = std::find(header.begin(), header.end(), name);
          if (at == header.end()) {
            return error(absl::StrCat(
                "no column ", storage::QuoteForMessage(name),
                "; the model takes ", absl::StrJoin(names, ", "), hint));
          }
          pick.push_back(at - header.begin());
        }
        continue;
      }
    }
    // Each value the model takes, named by its column as training names it;
    // columns it does not take (an id, the label) are not read.
    const auto value = [&](size_t c) -> absl::StatusOr<float> {
      const std::string column =
          c < header.size()
              ? absl::StrCat("column ", storage::QuoteForMessage(header[c]))
              : absl::StrCat("column ", c);
      float v = 0;
      if (absl::StripAsciiWhitespace(cells[c]).empty())
        return error(absl::StrCat(column, ": empty cell"));
      if (!number_of(cells[c], &v)) {
        return error(absl::StrCat(column, ": ",
                                  storage::QuoteForMessage(std::string_view(
                                      cells[c].data(), cells[c].size())),
                                  " is not a finite number"));
      }
      return v;
    };
    if (pick.empty()) {
      // The features alone, or a row of the header-less training table.
      const int64_t widest =
          by_number.empty()
              ? -1
              : *std::max_element(by_number.begin(), by_number.end());
      if (static_cast<int64_t>(cells.size()) != sample &&
          !(widest >= 0 && static_cast<int64_t>(cells.size()) > widest)) {
        return error(absl::StrCat(
            cells.size(), " cells, the model takes ", sample, " features",
            widest >= 0 ? absl::StrCat(" (or rows of its training table, "
                                       "whose columns ",
                                       absl::StrJoin(names, ", "), " they are)")
                        : ""));
      }
      if (static_cast<int64_t>(cells.size()) == sample) {
        for (size_t c = 0; c < cells.size(); ++c) {
          ASSIGN_OR_RETURN(const float v, value(c));
          s.values.push_back(v);
        }
      } else {
        for (int64_t c : by_number) {
          ASSIGN_OR_RETURN(const float v, value(static_cast<size_t>(c)));
          s.values.push_back(v);
        }
      }
    } else {
      if (cells.size() != header.size()) {
        return error(absl::StrCat(cells.size(), " cells, the header has ",
                                  header.size()));
      }
      for (int64_t c : pick) {
        ASSIGN_OR_RETURN(const float v, value(static_cast<size_t>(c)));
        s.values.push_back(v);
      }
    }
    ++s.count;
  }
  if (s.count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no rows"));
  }
  return s;
}

absl::StatusOr<Samples> ReadSamples(const std::string& path,
                                    const v1::JobSpec& spec, int64_t sample) {
  if (absl::EndsWith(path, ".npy")) return ReadNpySamples(path, spec, sample);
  if (absl::EndsWith(path, ".csv")) return ReadCsvSamples(path, spec, sample);
  if (IsImagePath(path)) {
    // Channels from the model's input: [C, H, W] takes C (1 or 3); a flat
    // input takes grey pixels.
    const auto& dims = spec.model().input().shape().dims();
    const int64_t channels = dims.size() == 3 ? dims[0] : 1;
    if (channels != 1 && channels != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": the model's input has ", channels,
                       " channels; images give 1 (grey) or 3 (RGB)"));
    }
    // ReadImage refuses another size than `sample`, at the header.
    ASSIGN_OR_RETURN(Image image,
                     ReadImage(path, static_cast<int>(channels), sample));
    // Pixels come as values / 255; a model whose normalization centres
    // its inputs far past 1 was trained on another scale (raw bytes in an
    // .npy), and would read the image as near-black.
    const auto& means = spec.data().normalize().mean();
    const auto far = std::find_if(means.begin(), means.end(),
                                  [](float m) { return std::fabs(m) > 2.0f; });
    if (!spec.data().has_fashion_mnist() && far != means.end()) {
      std::fprintf(stderr,
                   "gpipectl predict: warning: %s is read as pixel values / "
                   "255, but the model's normalization has a mean of %g: it "
                   "was trained on values of another scale (raw bytes?); "
                   "give its input as an .npy of that scale instead\n",
                   path.c_str(), *far);
    }
    return Samples{std::move(image.values), {}, 1};
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path,
                   ": give an .npy array, a .csv table or an image (.png, "
                   ".jpg, .pgm)"));
}

// One process: the model built whole, its parameters from the file.
absl::StatusOr<Tensor> Forward(const v1::JobSpec& spec, const Tensor& x) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   Model::Build(spec.model(), spec.seed()));
  RETURN_IF_ERROR(InitWholeModel(spec, model->StateTensors(), {}).status());
  RETURN_IF_ERROR(model->CheckInput(x));
  LayerContext ctx;
  ctx.training = false;
  return model->Forward(x, ctx, nullptr);
}

// --stages K: the samples stream through K stages on threads, each holding
// only its layers, batch by batch as a test split does.
absl::StatusOr<Tensor> ForwardOnPipeline(const v1::JobSpec& spec,
                                         const Tensor& x, int64_t classes) {
  PipelineOptions options = OptionsFromSpec(spec);
  options.stages = absl::GetFlag(FLAGS_stages);
  options.dataset = std::make_shared<ArrayDataset>(x, Tensor(), classes);
  ASSIGN_OR_RETURN(std::unique_ptr<InProcessPipeline> pipeline,
                   InProcessPipeline::Create(spec, options));
  return pipeline->Outputs(Split::kTest, 0);
}

}  // namespace

int RunPredict(const std::vector<std::string>& args) {
  if (args.size() != 2) {
    std::fprintf(
        stderr,
        "usage: gpipectl predict MODEL.safetensors INPUT.npy|.csv|"
        ".png|.jpg|.pgm [--top K] [--stages K] [--json] [--logits F.npy] "
        "[--csv-header auto|yes|no]\n");
    return 2;
  }
  if (const std::string h = absl::GetFlag(FLAGS_csv_header);
      h != "auto" && h != "yes" && h != "no") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--csv-header: '", h, "' is not auto, yes or no")));
  }
  absl::StatusOr<v1::JobSpec> spec = SpecToServe(args[0], "");
  if (!spec.ok()) return Fail(spec.status());
  const auto& dims = spec->model().input().shape().dims();
  const Shape input(std::vector<int64_t>(dims.begin(), dims.end()));
  absl::StatusOr<ModelShapes> shapes = InferModelShapes(spec->model());
  if (!shapes.ok()) return Fail(shapes.status());
  const Shape& out = shapes->outputs.back();
  if (out.rank() != 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        args[0], " outputs ", out.ToString(),
        " per sample: predict is for classifiers (one score per class); a "
        "language model generates")));
  }
  absl::StatusOr<Samples> samples = ReadSamples(args[1], *spec, input.numel());
  if (!samples.ok()) return Fail(samples.status());
  const bool ids = spec->model().input().dtype() == v1::INT32;
  Tensor x = Tensor::Empty(input.WithBatch(samples->count),
                           ids ? DType::kI32 : DType::kF32);
  if (ids) {
    std::copy(samples->ids.begin(), samples->ids.end(), x.i32());
  } else {
    std::copy(samples->values.begin(), samples->values.end(), x.f32());
    if (spec->data().has_normalize()) {
      if (absl::Status s = NormalizeInPlace(spec->data().normalize(), &x);
          !s.ok()) {
        return Fail(s);
      }
    }
  }
  const int64_t classes = out[0];
  absl::StatusOr<Tensor> logits = absl::GetFlag(FLAGS_stages) > 1
                                      ? ForwardOnPipeline(*spec, x, classes)
                                      : Forward(*spec, x);
  if (!logits.ok()) return Fail(logits.status());
  // The printed probabilities carry 6 digits; a comparison with another
  // framework, or a further model, needs the scores themselves.
  if (const std::string path = absl::GetFlag(FLAGS_logits); !path.empty()) {
    if (absl::Status s = storage::WriteFileAtomically(
            path, EncodeNpyF32({samples->count, classes}, logits->f32()));
        !s.ok()) {
      return Fail(s);
    }
  }

  const int64_t top = std::clamp<int64_t>(absl::GetFlag(FLAGS_top), 1, classes);
  const bool json = absl::GetFlag(FLAGS_json);
  const auto name = [&](int64_t c) -> std::string {
    return spec->data().has_fashion_mnist() && c < 10 ? kFashionClasses[c] : "";
  };
  if (json) std::printf("{\"predictions\": [");
  for (int64_t i = 0; i < samples->count; ++i) {
    const float* row = logits->f32() + i * classes;
    // Softmax in double: probabilities to print, not to train with.
    const double peak = *std::max_element(row, row + classes);
    std::vector<double> p(classes);
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += p[c] = std::exp(row[c] - peak);
    for (double& v : p) v /= sum;
    std::vector<int64_t> order(classes);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    if (json) {
      std::printf("%s{\"class\": %lld, ", i > 0 ? ", " : "",
                  static_cast<long long>(order[0]));
      if (!name(order[0]).empty()) {
        std::printf("\"name\": \"%s\", ", name(order[0]).c_str());
      }
      std::printf("\"probability\": %.6g, \"top\": [", p[order[0]]);
      for (int64_t k = 0; k < top; ++k) {
        std::printf("%s{\"class\": %lld, \"probability\": %.6g}",
                    k > 0 ? ", " : "", static_cast<long long>(order[k]),
                    p[order[k]]);
      }
      std::printf("]}");
      continue;
    }
    std::string line = absl::StrCat(args[1], "[", i, "]:");
    for (int64_t k = 0; k < top; ++k) {
      const std::string n = name(order[k]);
      absl::StrAppend(&line, k > 0 ? "," : "", " class ", order[k],
                      n.empty() ? "" : absl::StrCat(" (", n, ")"), " ",
                      absl::StrFormat("%.3f", p[order[k]]));
    }
    std::printf("%s\n", line.c_str());
  }
  if (json) std::printf("]}\n");
  return 0;
}

}  // namespace gpipe::cli
