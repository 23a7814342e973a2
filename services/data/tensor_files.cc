#include "services/data/tensor_files.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/data/npy.h"
#include "services/data/numeric_array.h"
#include "services/data/safetensors_array.h"
#include "services/storage/safetensors_header.h"
#include "services/tensor/allocator.h"

namespace gpipe {
namespace {

// Where an array comes from, for reading it and for every message about
// it: "targets: /d/y.npy: " or "inputs: /d/a.safetensors: tensor "x": ".
struct Source {
  std::string field;  // of TensorFiles
  std::string path;
  std::string key;  // the tensor's name in a .safetensors file

  bool safetensors() const {
    return absl::EndsWithIgnoreCase(path, ".safetensors");
  }
  std::string Where() const {
    return safetensors() ? absl::StrCat(field, ": ", path, ": tensor ",
                                        storage::QuoteForMessage(key), ": ")
                         : absl::StrCat(field, ": ", path, ": ");
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(), what));
  }
  // A reader's error (which names the path) under this source's field.
  absl::Status InField(const absl::Status& s) const {
    return absl::Status(s.code(), absl::StrCat(field, ": ", s.message()));
  }
};

absl::StatusOr<NumericArray> ReadArray(const Source& source) {
  absl::StatusOr<NumericArray> array;
  if (absl::EndsWithIgnoreCase(source.path, ".npy")) {
    array = ReadNpy(source.path);
  } else if (source.safetensors()) {
    array = ReadSafetensorsArray(source.path, source.key);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source.field, ": ", source.path,
                     ": not a .npy or .safetensors file (judged by its name)"));
  }
  if (!array.ok()) return source.InField(array.status());
  return array;
}

std::vector<int64_t> SampleShape(const NumericArray& a) {
  return std::vector<int64_t>(a.shape.begin() + 1, a.shape.end());
}

// One split as read and converted, before it becomes a Part.
struct Loaded {
  int64_t n = 0;
  std::vector<int64_t> sample_shape;  // as in the file
  std::vector<int64_t> target_shape;  // [] or [T]
  std::vector<float> f32;
  std::vector<int32_t> i32;
  std::vector<int32_t> targets;
};

absl::StatusOr<Loaded> LoadSplit(const Source& inputs, const Source& targets,
                                 DType dtype) {
  Loaded out;
  ASSIGN_OR_RETURN(NumericArray x, ReadArray(inputs));
  if (x.shape.empty()) {
    return inputs.Error("a scalar; inputs are [N, sample...]");
  }
  out.n = x.shape[0];
  out.sample_shape = SampleShape(x);
  if (dtype == DType::kF32) {
    absl::StatusOr<std::vector<float>> v = ToFloat32(x);
    if (!v.ok()) return inputs.Error(v.status().message());
    out.f32 = std::move(*v);
  } else {
    absl::StatusOr<std::vector<int32_t>> v =
        ToInt32(x, "ids (the model's input is int32)");
    if (!v.ok()) return inputs.Error(v.status().message());
    out.i32 = std::move(*v);
    const auto negative = std::find_if(out.i32.begin(), out.i32.end(),
                                       [](int32_t id) { return id < 0; });
    if (negative != out.i32.end()) {
      const int64_t i = negative - out.i32.begin();
      const int64_t per_sample = static_cast<int64_t>(out.i32.size()) / out.n;
      return inputs.Error(absl::StrCat("id ", *negative, " at sample ",
                                       i / per_sample,
                                       " (input ids are >= 0)"));
    }
  }
  x = NumericArray();  // its bytes are converted; free them before the next

  ASSIGN_OR_RETURN(NumericArray y, ReadArray(targets));
  if (y.shape.size() != 1 && y.shape.size() != 2) {
    return targets.Error(absl::StrCat("shape ", ShapeToString(y.shape),
                                      "; targets are [N] or [N, T]"));
  }
  if (y.shape[0] != out.n) {
    return targets.Error(absl::StrCat(y.shape[0], " samples, but ",
                                      inputs.field, " ", inputs.path, " has ",
                                      out.n));
  }
  out.target_shape = SampleShape(y);
  absl::StatusOr<std::vector<int32_t>> t = ToInt32(y, "class ids");
  if (!t.ok()) return targets.Error(t.status().message());
  out.targets = std::move(*t);
  const auto bad = std::find_if(out.targets.begin(), out.targets.end(),
                                [](int32_t id) { return id < -1; });
  if (bad != out.targets.end()) {
    const int64_t i = bad - out.targets.begin();
    const std::string at = y.shape.size() == 1
                               ? absl::StrCat("sample ", i)
                               : absl::StrCat("sample ", i / y.shape[1],
                                              ", position ", i % y.shape[1]);
    return targets.Error(absl::StrCat("id ", *bad, " at ", at,
                                      " (ids are >= 0, or -1 for none)"));
  }
  return out;
}

// Copies the elements [begin, end) of `v` onto the end of `to`, then drops
// them from `v`: the tail of a split becomes another.
template <typename T>
void MoveTail(std::vector<T>* v, size_t begin, std::vector<T>* to) {
  to->assign(v->begin() + static_cast<std::ptrdiff_t>(begin), v->end());
  v->resize(begin);
  v->shrink_to_fit();
}

}  // namespace

void TensorFilesDataset::SplitOffTest(int64_t n) {
  const int64_t keep = train_.n - n;
  const int64_t per_input = input_shape_.numel();
  const int64_t per_target = target_shape_.numel();
  if (input_dtype_ == DType::kF32) {
    MoveTail(&train_.f32, keep * per_input, &test_.f32);
  } else {
    MoveTail(&train_.i32, keep * per_input, &test_.i32);
  }
  MoveTail(&train_.targets, keep * per_target, &test_.targets);
  train_.n = keep;
  test_.n = n;
}

absl::StatusOr<std::unique_ptr<TensorFilesDataset>> TensorFilesDataset::Open(
    const gpipe::v1::TensorFiles& spec, const Shape& model_input,
    DType model_dtype) {
  const std::string input_key =
      spec.input_key().empty() ? "inputs" : spec.input_key();
  const std::string target_key =
      spec.target_key().empty() ? "targets" : spec.target_key();
  if (spec.inputs().empty()) {
    return absl::InvalidArgumentError("inputs: required");
  }
  const double fraction = spec.test_fraction();
  if (!(fraction >= 0 && fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "test_fraction: must be in [0, 1) (0 means the default 0.1), got ",
        fraction));
  }
  const bool has_test = !spec.test_inputs().empty();
  Source inputs{"inputs", spec.inputs(), input_key};
  Source targets{"targets", spec.targets(), target_key};
  Source test_inputs{"test_inputs", spec.test_inputs(), input_key};
  Source test_targets{"test_targets", spec.test_targets(), target_key};
  for (const Source* s : {&inputs, &targets, &test_inputs, &test_targets}) {
    if (absl::EndsWithIgnoreCase(s->path, ".npz")) {
      return absl::InvalidArgumentError(absl::StrCat(
          s->field, ": ", s->path,
          ": an .npz archive is not read; save each array with np.save "
          "(inputs.npy, targets.npy), or both in one file with "
          "safetensors.numpy.save_file({\"inputs\": x, \"targets\": y}, "
          "PATH)"));
    }
  }
  if (spec.targets().empty()) {
    // Both come from one safetensors file, under two keys.
    if (!inputs.safetensors()) {
      return absl::InvalidArgumentError(
          absl::StrCat("targets: required unless inputs is a .safetensors "
                       "file that holds them (tensor \"",
                       target_key, "\"); inputs is ", spec.inputs()));
    }
    if (!spec.test_targets().empty()) {
      return absl::InvalidArgumentError(
          "test_targets: must be empty when targets is (the test targets "
          "are then a tensor of test_inputs)");
    }
    if (has_test && !test_inputs.safetensors()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "test_inputs: ", spec.test_inputs(),
          ": must be a .safetensors file holding the test targets too "
          "(tensor \"",
          target_key, "\"), as targets is empty"));
    }
    // A tensor missing under the key the user gave is that field's
    // mistake ("inputs: ...: no tensor \"labels\"" pointed at the inputs).
    const char* field = spec.target_key().empty() ? nullptr : "target_key";
    targets = {field != nullptr ? field : "inputs", spec.inputs(), target_key};
    test_targets = {field != nullptr ? field : "test_inputs",
                    spec.test_inputs(), target_key};
  } else if (has_test != !spec.test_targets().empty()) {
    return absl::InvalidArgumentError(
        has_test ? "test_targets: required with test_inputs"
                 : "test_inputs: required with test_targets");
  }

  ASSIGN_OR_RETURN(Loaded train, LoadSplit(inputs, targets, model_dtype));
  std::unique_ptr<TensorFilesDataset> d(new TensorFilesDataset());
  d->input_dtype_ = model_dtype;
  d->target_shape_ = Shape(train.target_shape);
  int64_t sample_numel = 1;
  for (int64_t dim : train.sample_shape) sample_numel *= dim;
  if (model_input.rank() == 0) {
    d->input_shape_ = Shape(train.sample_shape);
  } else if (model_input.numel() != sample_numel) {
    return inputs.Error(absl::StrCat(
        "a sample has ", sample_numel, " elements (",
        ShapeToString(train.sample_shape), "), but the model input ",
        model_input.ToString(), " holds ", model_input.numel()));
  } else {
    d->input_shape_ = model_input;
  }

  if (has_test) {
    ASSIGN_OR_RETURN(Loaded test,
                     LoadSplit(test_inputs, test_targets, model_dtype));
    if (test.sample_shape != train.sample_shape) {
      return test_inputs.Error(absl::StrCat(
          "samples are ", ShapeToString(test.sample_shape), ", but ",
          ShapeToString(train.sample_shape), " in ", spec.inputs()));
    }
    if (test.target_shape != train.target_shape) {
      return test_targets.Error(absl::StrCat(
          "targets per sample are ", ShapeToString(test.target_shape), ", but ",
          ShapeToString(train.target_shape), " in ", targets.path));
    }
    d->test_ = Part{test.n, std::move(test.f32), std::move(test.i32),
                    std::move(test.targets)};
  }
  d->train_ = Part{train.n, std::move(train.f32), std::move(train.i32),
                   std::move(train.targets)};
  if (!has_test) {
    const double f = fraction == 0 ? kDefaultTestFraction : fraction;
    const int64_t n = d->train_.n;
    const int64_t test_n =
        static_cast<int64_t>(std::floor(static_cast<double>(n) * f));
    if (test_n < 1 || test_n >= n) {
      return inputs.Error(
          absl::StrCat(n, " samples are too few to split with test_fraction ",
                       f, " (each split needs at least one)"));
    }
    d->SplitOffTest(test_n);
  }
  for (const auto& [part, source] :
       {std::pair{&d->train_, &inputs}, std::pair{&d->test_, &test_inputs}}) {
    if (part->n < 1) return source->Error("no samples");
  }

  int32_t max_target = 0;
  int32_t max_id = -1;
  for (const Part* p : {&d->train_, &d->test_}) {
    for (int32_t t : p->targets) max_target = std::max(max_target, t);
    for (int32_t id : p->i32) max_id = std::max(max_id, id);
  }
  if (std::all_of(d->train_.targets.begin(), d->train_.targets.end(),
                  [](int32_t t) { return t == -1; })) {
    return targets.Error(
        "every target of the train split is -1 (none): nothing to learn");
  }
  d->num_classes_ = int64_t{max_target} + 1;
  d->num_input_ids_ = model_dtype == DType::kI32 ? int64_t{max_id} + 1 : 0;
  return d;
}

int64_t TensorFilesDataset::size(Split split) const { return part(split).n; }

Batch TensorFilesDataset::Gather(Split split,
                                 const std::vector<int64_t>& indices) const {
  // Host memory whatever allocator the caller has installed.
  AllocatorScope host(DefaultCpuAllocator());
  const Part& p = part(split);
  const int64_t b = static_cast<int64_t>(indices.size());
  const int64_t per = input_shape_.numel();
  Tensor inputs = Tensor::Empty(input_shape_.WithBatch(b), input_dtype_);
  for (int64_t i = 0; i < b; ++i) {
    const size_t from = static_cast<size_t>(indices[i] * per);
    if (input_dtype_ == DType::kF32) {
      std::copy_n(p.f32.begin() + from, per, inputs.f32() + i * per);
    } else {
      std::copy_n(p.i32.begin() + from, per, inputs.i32() + i * per);
    }
  }
  return Batch{std::move(inputs), GatherTargets(split, indices)};
}

Tensor TensorFilesDataset::GatherTargets(
    Split split, const std::vector<int64_t>& indices) const {
  AllocatorScope host(DefaultCpuAllocator());
  const Part& p = part(split);
  const int64_t b = static_cast<int64_t>(indices.size());
  const int64_t per = target_shape_.numel();
  Tensor targets = Tensor::Empty(target_shape_.WithBatch(b), DType::kI32);
  for (int64_t i = 0; i < b; ++i) {
    std::copy_n(p.targets.begin() + static_cast<size_t>(indices[i] * per), per,
                targets.i32() + i * per);
  }
  return targets;
}

}  // namespace gpipe
