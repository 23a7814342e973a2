#include "services/data/synthetic.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/core/rng.h"
#include "services/tensor/allocator.h"

namespace gpipe {
namespace {

// Samples are keyed by MixKey({seed, split, index}); the centers by a key of
// another length, so the two never collide.
constexpr uint64_t kCentersTag = 0x63656e74657273ULL;  // "centers"

uint64_t SampleKey(uint64_t seed, Split split, int64_t index) {
  return MixKey({seed, split == Split::kTrain ? 0ULL : 1ULL,
                 static_cast<uint64_t>(index)});
}

absl::Status CheckPositive(const char* field, int64_t value,
                           int64_t max = INT32_MAX) {
  if (value <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be positive, got ", value));
  }
  if (value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value, " is larger than ", max));
  }
  return absl::OkStatus();
}

}  // namespace

SequenceTask::SequenceTask(Kind kind, int64_t vocab_size, int64_t length,
                           int64_t train_samples, int64_t test_samples,
                           uint64_t seed)
    : kind_(kind),
      vocab_size_(vocab_size),
      length_(length),
      train_samples_(train_samples),
      test_samples_(test_samples),
      seed_(seed) {}

int64_t SequenceTask::size(Split split) const {
  return split == Split::kTrain ? train_samples_ : test_samples_;
}

std::vector<int32_t> SequenceTask::Sequence(Split split, int64_t index) const {
  Rng rng(SampleKey(seed_, split, index));
  std::vector<int32_t> s(2 * length_ + 1);
  for (int64_t t = 0; t < length_; ++t) {
    s[t] = static_cast<int32_t>(rng.Below(vocab_size_));
  }
  s[length_] = separator();
  for (int64_t t = 0; t < length_; ++t) {
    s[length_ + 1 + t] = kind_ == Kind::kCopy ? s[t] : s[length_ - 1 - t];
  }
  return s;
}

Batch SequenceTask::Gather(Split split,
                           const std::vector<int64_t>& indices) const {
  AllocatorScope host(DefaultCpuAllocator());
  const int64_t b = static_cast<int64_t>(indices.size());
  const int64_t t_len = 2 * length_;
  Batch batch{Tensor::Empty(Shape{b, t_len}, DType::kI32),
              Tensor::Empty(Shape{b, t_len}, DType::kI32)};
  int32_t* x = batch.inputs.i32();
  int32_t* y = batch.targets.i32();
  for (int64_t i = 0; i < b; ++i) {
    const std::vector<int32_t> s = Sequence(split, indices[i]);
    for (int64_t t = 0; t < t_len; ++t) {
      x[i * t_len + t] = s[t];
      // Position t predicts s[t + 1]; x and the separator are unpredictable.
      y[i * t_len + t] = t + 1 > length_ ? s[t + 1] : -1;
    }
  }
  return batch;
}

GaussianClasses::GaussianClasses(int64_t features, int64_t classes,
                                 int64_t train_samples, int64_t test_samples,
                                 uint64_t seed)
    : features_(features),
      classes_(classes),
      train_samples_(train_samples),
      test_samples_(test_samples),
      seed_(seed),
      centers_(features * classes) {
  Rng rng(MixKey({seed, kCentersTag}));
  for (float& c : centers_) c = static_cast<float>(rng.Normal());
}

int64_t GaussianClasses::size(Split split) const {
  return split == Split::kTrain ? train_samples_ : test_samples_;
}

void GaussianClasses::Draw(Split split, int64_t index, int32_t* label,
                           float* x) const {
  Rng rng(SampleKey(seed_, split, index));
  const int64_t l = static_cast<int64_t>(rng.Below(classes_));
  const float* c = center(l);
  for (int64_t f = 0; f < features_; ++f)
    x[f] = static_cast<float>(c[f] + kNoise * rng.Normal());
  *label = static_cast<int32_t>(l);
}

const GaussianClasses::Drawn* GaussianClasses::DrawnSplit(Split split) const {
  const int64_t n = size(split);
  if (n * features_ > kDrawnOnceFloats) return nullptr;
  Drawn& d = drawn_[split == Split::kTrain ? 0 : 1];
  std::call_once(d.once, [&] {
    d.features.resize(n * features_);
    d.labels.resize(n);
    for (int64_t i = 0; i < n; ++i)
      Draw(split, i, &d.labels[i], d.features.data() + i * features_);
  });
  return &d;
}

Batch GaussianClasses::Gather(Split split,
                              const std::vector<int64_t>& indices) const {
  AllocatorScope host(DefaultCpuAllocator());
  const int64_t b = static_cast<int64_t>(indices.size());
  Batch batch{Tensor::Empty(Shape{b, features_}, DType::kF32),
              Tensor::Empty(Shape{b}, DType::kI32)};
  float* x = batch.inputs.f32();
  int32_t* y = batch.targets.i32();
  const Drawn* drawn = DrawnSplit(split);
  const int64_t n = size(split);
  for (int64_t i = 0; i < b; ++i) {
    if (drawn != nullptr && indices[i] >= 0 && indices[i] < n) {
      std::copy_n(drawn->features.data() + indices[i] * features_, features_,
                  x + i * features_);
      y[i] = drawn->labels[indices[i]];
    } else {
      Draw(split, indices[i], &y[i], x + i * features_);
    }
  }
  return batch;
}

Tensor GaussianClasses::GatherTargets(
    Split split, const std::vector<int64_t>& indices) const {
  AllocatorScope host(DefaultCpuAllocator());
  const int64_t b = static_cast<int64_t>(indices.size());
  Tensor targets = Tensor::Empty(Shape{b}, DType::kI32);
  for (int64_t i = 0; i < b; ++i) {
    Rng rng(SampleKey(seed_, split, indices[i]));
    targets.i32()[i] = static_cast<int32_t>(rng.Below(classes_));
  }
  return targets;
}

int64_t SyntheticTestSamples(const gpipe::v1::Synthetic& spec) {
  if (spec.test_samples() != 0) return spec.test_samples();
  return std::max<int64_t>(1, spec.train_samples() / 10);
}

absl::StatusOr<std::unique_ptr<Dataset>> MakeSynthetic(
    const gpipe::v1::Synthetic& spec, uint64_t seed) {
  // Keep generation cheap and tensors addressable with int32 ids.
  constexpr int64_t kMaxSamples = int64_t{1} << 40;
  if (auto s =
          CheckPositive("train_samples", spec.train_samples(), kMaxSamples);
      !s.ok()) {
    return s;
  }
  const int64_t test_samples = SyntheticTestSamples(spec);
  if (auto s = CheckPositive("test_samples", test_samples, kMaxSamples);
      !s.ok()) {
    return s;
  }
  switch (spec.task()) {
    case gpipe::v1::COPY:
    case gpipe::v1::REVERSE: {
      // vocab_size + 1 classes must fit an int32 id.
      if (auto s =
              CheckPositive("vocab_size", spec.vocab_size(), INT32_MAX - 1);
          !s.ok()) {
        return s;
      }
      if (auto s = CheckPositive("length", spec.length(), INT32_MAX / 2);
          !s.ok()) {
        return s;
      }
      const auto kind = spec.task() == gpipe::v1::COPY
                            ? SequenceTask::Kind::kCopy
                            : SequenceTask::Kind::kReverse;
      return std::make_unique<SequenceTask>(kind, spec.vocab_size(),
                                            spec.length(), spec.train_samples(),
                                            test_samples, seed);
    }
    case gpipe::v1::CLASSES: {
      if (auto s = CheckPositive("features", spec.features()); !s.ok()) {
        return s;
      }
      if (auto s = CheckPositive("classes", spec.classes()); !s.ok()) return s;
      if (spec.features() * spec.classes() > (int64_t{1} << 28)) {
        return absl::InvalidArgumentError(
            absl::StrCat("features: ", spec.features(), " x ", spec.classes(),
                         " classes of centers is too many"));
      }
      return std::make_unique<GaussianClasses>(spec.features(), spec.classes(),
                                               spec.train_samples(),
                                               test_samples, seed);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("task: must be COPY, REVERSE or CLASSES, got ",
                       static_cast<int>(spec.task())));
  }
}

}  // namespace gpipe
