// Language modelling on pre-tokenized data: a flat binary file of token ids,
// little-endian uint16 or uint32, as nanoGPT's prepare scripts write them
// (train.bin, val.bin) and llm.c too after its 1024-byte header
// (header_bytes). The file is mapped, not read: a corpus of billions of
// tokens costs address space, not memory. A sample is seq_len ids with the
// next id of each as its targets.
#ifndef GPIPE_SERVICES_DATA_TOKENS_H_
#define GPIPE_SERVICES_DATA_TOKENS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/data/dataset.h"

namespace gpipe {

struct TokenFileOptions {
  std::string path;
  std::string test_path;  // "": the last test_fraction of `path`
  int bytes_per_id = 2;   // 2 (uint16) or 4 (uint32)
  int64_t seq_len = 0;
  double test_fraction = 0;  // 0: 0.1; unused with a test_path
  int64_t header_bytes = 0;  // skipped at the start of each file
};

class TokenDataset final : public Dataset {
 public:
  static constexpr double kDefaultTestFraction = 0.1;

  // Maps the file(s) and scans every id once for the largest. A missing file
  // is NotFound; a length after the header that is not a whole number of
  // ids, an id past int32, or a split shorter than seq_len + 1 ids is
  // InvalidArgument; all name the file.
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Open(
      const TokenFileOptions& options);
  ~TokenDataset() override;

  int64_t size(Split split) const override;
  Shape input_shape() const override { return Shape{seq_len_}; }
  DType input_dtype() const override { return DType::kI32; }
  Shape target_shape() const override { return Shape{seq_len_}; }
  // The largest id in the data plus one: what the embedding and the head
  // must hold.
  int64_t num_classes() const override { return max_id_ + 1; }
  Batch Gather(Split split, const std::vector<int64_t>& indices) const override;

 private:
  struct Mapped;  // one mapped file's ids
  TokenDataset() = default;
  int64_t Id(Split split, int64_t i) const;

  std::vector<std::unique_ptr<Mapped>> files_;
  // Each split: which file, where its ids start and how many.
  struct Range {
    const Mapped* file = nullptr;
    int64_t begin = 0;
    int64_t count = 0;
  };
  Range train_, test_;
  int64_t seq_len_ = 0;
  int64_t max_id_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_TOKENS_H_
