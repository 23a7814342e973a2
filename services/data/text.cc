#include "services/data/text.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/data/windows.h"
#include "services/storage/file_io.h"

namespace gpipe {
namespace {

// A regular file only: /dev/zero was read until memory ran out.
absl::StatusOr<std::vector<uint8_t>> ReadFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, storage::ReadWholeFile(path));
  return std::vector<uint8_t>(text.begin(), text.end());
}

}  // namespace

TextDataset::TextDataset(std::vector<uint8_t> tokens,
                         std::vector<uint8_t> vocabulary,
                         std::array<int32_t, 256> token_of, int64_t train_bytes,
                         int64_t seq_len)
    : tokens_(std::move(tokens)),
      vocabulary_(std::move(vocabulary)),
      token_of_(token_of),
      train_bytes_(train_bytes),
      seq_len_(seq_len) {}

absl::StatusOr<std::unique_ptr<TextDataset>> TextDataset::Open(
    const std::string& path, int64_t seq_len, double test_fraction,
    std::string_view given_vocabulary) {
  if (seq_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len must be positive, got ", seq_len));
  }
  if (test_fraction == 0) test_fraction = kDefaultTestFraction;
  if (!(test_fraction > 0 && test_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("test_fraction must be in (0, 1), got ", test_fraction));
  }
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": file is empty"));
  }

  const int64_t n = static_cast<int64_t>(bytes.size());
  const int64_t test_bytes =
      static_cast<int64_t>(std::floor(static_cast<double>(n) * test_fraction));
  const int64_t train_bytes = n - test_bytes;
  for (auto [name, have] :
       {std::pair{"train", train_bytes}, std::pair{"test", test_bytes}}) {
    if (have < seq_len + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": the ", name, " split has ", have,
          " bytes, fewer than seq_len + 1 = ", seq_len + 1, " (file has ", n,
          " bytes, test_fraction ", test_fraction, ")"));
    }
  }

  std::vector<uint8_t> vocabulary;
  if (given_vocabulary.empty()) {
    std::array<bool, 256> seen{};
    for (uint8_t b : bytes) seen[b] = true;
    for (int b = 0; b < 256; ++b) {
      if (seen[b]) vocabulary.push_back(static_cast<uint8_t>(b));
    }
  } else {
    vocabulary.assign(given_vocabulary.begin(), given_vocabulary.end());
    for (size_t i = 1; i < vocabulary.size(); ++i) {
      if (vocabulary[i] <= vocabulary[i - 1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the vocabulary must hold distinct bytes in ascending order; "
            "byte ",
            int{vocabulary[i]}, " follows ", int{vocabulary[i - 1]}));
      }
    }
  }
  std::array<int32_t, 256> token_of;
  token_of.fill(-1);
  for (size_t id = 0; id < vocabulary.size(); ++id) {
    token_of[vocabulary[id]] = static_cast<int32_t>(id);
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int32_t id = token_of[bytes[i]];
    if (id < 0) {
      // The byte as the user would see it in the file, and where a given
      // vocabulary came from: the spec's field is base64 in JSON (a plain
      // "abc" decodes to two other bytes), or the model a job starts from
      // recorded it.
      const int b = bytes[i];
      const std::string shown =
          b >= 0x20 && b < 0x7f ? absl::StrCat(" ('", std::string(1, b), "')")
                                : "";
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": byte ", b, shown, " at offset ", i,
          given_vocabulary.empty()
              ? absl::StrCat(" is not in the vocabulary (", vocabulary.size(),
                             " bytes)")
              : absl::StrCat(
                    " is not in the vocabulary of ", vocabulary.size(),
                    " bytes the job was given (data.text.vocabulary, base64 "
                    "in a spec's JSON; the one the model it starts from "
                    "was trained with; or the file's own, recorded when the "
                    "job was submitted, if the file changed since)")));
    }
    bytes[i] = static_cast<uint8_t>(id);
  }
  return std::unique_ptr<TextDataset>(new TextDataset(
      std::move(bytes), std::move(vocabulary), token_of, train_bytes, seq_len));
}

int64_t TextDataset::size(Split split) const {
  return (split_bytes(split) - 1) / seq_len_;
}

Batch TextDataset::Gather(Split split,
                          const std::vector<int64_t>& indices) const {
  const uint8_t* ids = &tokens_[split_begin(split)];
  return GatherWindows(indices, seq_len_, [ids](int64_t p) { return ids[p]; });
}

}  // namespace gpipe
