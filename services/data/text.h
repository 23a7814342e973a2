// Character-level language modelling on any file: each byte is a token, and
// a sample is seq_len tokens with the next token of each as its targets.
#ifndef GPIPE_SERVICES_DATA_TEXT_H_
#define GPIPE_SERVICES_DATA_TEXT_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "services/data/dataset.h"

namespace gpipe {

class TextDataset final : public Dataset {
 public:
  static constexpr double kDefaultTestFraction = 0.1;

  // Reads the whole file. The vocabulary is the sorted set of distinct bytes
  // in it; the last `test_fraction` of the file (0: kDefaultTestFraction) is
  // the test split. Each split is cut into (length - 1) / seq_len
  // non-overlapping windows, so every byte but the last is predicted once.
  // A missing file is NotFound; an empty file, or a split shorter than
  // seq_len + 1 bytes, is InvalidArgument; all name `path`.
  // A non-empty `vocabulary` (ascending distinct bytes, as a trained model's
  // file records them) fixes the ids instead: a byte of the file outside it
  // is InvalidArgument naming the byte and its offset.
  static absl::StatusOr<std::unique_ptr<TextDataset>> Open(
      const std::string& path, int64_t seq_len, double test_fraction = 0,
      std::string_view vocabulary = {});

  int64_t size(Split split) const override;
  Shape input_shape() const override { return Shape{seq_len_}; }
  DType input_dtype() const override { return DType::kI32; }
  Shape target_shape() const override { return Shape{seq_len_}; }
  int64_t num_classes() const override {
    return static_cast<int64_t>(vocabulary_.size());
  }
  // Inputs [B, T] token ids and targets [B, T], the ids one byte later.
  Batch Gather(Split split, const std::vector<int64_t>& indices) const override;

  // The byte each token id stands for, ascending.
  const std::vector<uint8_t>& vocabulary() const { return vocabulary_; }
  // The token id of `byte`, or -1 when the file never contains it.
  int32_t TokenOf(uint8_t byte) const { return token_of_[byte]; }
  // Where each split starts in the file and how many bytes it has.
  int64_t split_begin(Split split) const {
    return split == Split::kTrain ? 0 : train_bytes_;
  }
  int64_t split_bytes(Split split) const {
    return split == Split::kTrain
               ? train_bytes_
               : static_cast<int64_t>(tokens_.size()) - train_bytes_;
  }

 private:
  TextDataset(std::vector<uint8_t> tokens, std::vector<uint8_t> vocabulary,
              std::array<int32_t, 256> token_of, int64_t train_bytes,
              int64_t seq_len);

  std::vector<uint8_t> tokens_;  // the file, each byte replaced by its id
  std::vector<uint8_t> vocabulary_;
  std::array<int32_t, 256> token_of_;
  int64_t train_bytes_;
  int64_t seq_len_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_TEXT_H_
