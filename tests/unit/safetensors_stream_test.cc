// Safetensors as streams: the encoder's bytes are WriteSafetensors' file,
// the decoder builds the same tensors as ReadSafetensors from bytes that
// arrive in any pieces, and refuses short, long and malformed streams; the
// incremental sha256 matches the one-shot digest.
#include "services/storage/safetensors_stream.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/storage/sha256.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

class SafetensorsStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::path(::testing::TempDir()) /
             absl::StrCat("safetensors_stream_test-", getpid(), ".st"))
                .string();
    a_ = Tensor::Empty(Shape({3, 5}));
    for (int64_t i = 0; i < a_.numel(); ++i) a_.f32()[i] = 0.25f * i - 1;
    b_ = Tensor::Empty(Shape({7}), DType::kI32);
    for (int64_t i = 0; i < b_.numel(); ++i) b_.i32()[i] = 3 * i - 4;
    empty_ = Tensor::Empty(Shape({0, 4}));
    tensors_ = {{"layers.1.weight", &a_},
                {"layers.0.index", &b_},
                {"layers.2.none", &empty_}};
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::string Encoded(size_t piece) {
    auto encoder = SafetensorsEncoder::Create(tensors_, {{"step", "4"}});
    EXPECT_TRUE(encoder.ok()) << encoder.status();
    std::string bytes;
    EXPECT_TRUE(encoder
                    ->Encode(
                        [&](std::string_view b) {
                          // The header comes whole; data in pieces.
                          if (!bytes.empty()) EXPECT_LE(b.size(), piece);
                          bytes.append(b);
                          return absl::OkStatus();
                        },
                        piece)
                    .ok());
    EXPECT_EQ(bytes.size(), encoder->size());
    return bytes;
  }

  std::string path_;
  Tensor a_, b_, empty_;
  std::vector<std::pair<std::string, const Tensor*>> tensors_;
};

TEST_F(SafetensorsStreamTest, EncoderWritesTheFileWriteSafetensorsWrites) {
  ASSERT_TRUE(WriteSafetensors(path_, tensors_, {{"step", "4"}}).ok());
  std::ifstream in(path_, std::ios::binary);
  const std::string file(std::istreambuf_iterator<char>(in), {});
  EXPECT_EQ(Encoded(7), file);
  EXPECT_EQ(Encoded(1 << 20), file);
}

TEST_F(SafetensorsStreamTest, DecoderTakesAnyPieces) {
  const std::string bytes = Encoded(1 << 20);
  std::mt19937 rng(5);
  for (size_t max_piece : {size_t{1}, size_t{3}, size_t{64}, bytes.size()}) {
    SafetensorsDecoder decoder(bytes.size(), "test.st");
    for (size_t at = 0; at < bytes.size();) {
      const size_t n = std::min(bytes.size() - at, 1 + rng() % max_piece);
      ASSERT_TRUE(decoder.Consume(std::string_view(bytes).substr(at, n)).ok());
      at += n;
    }
    absl::StatusOr<SafetensorsFile> file = decoder.Finish();
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(file->metadata.at("step"), "4");
    EXPECT_EQ(file->tensors.at("layers.1.weight").ToVector(), a_.ToVector());
    const Tensor& b = file->tensors.at("layers.0.index");
    EXPECT_EQ(std::vector<int32_t>(b.i32(), b.i32() + b.numel()),
              std::vector<int32_t>(b_.i32(), b_.i32() + b_.numel()));
    EXPECT_EQ(file->tensors.at("layers.2.none").numel(), 0);
  }
}

TEST_F(SafetensorsStreamTest, DecoderRefusesShortLongAndMalformedStreams) {
  const std::string bytes = Encoded(1 << 20);
  {
    SafetensorsDecoder decoder(bytes.size(), "short.st");
    ASSERT_TRUE(decoder.Consume(bytes.substr(0, bytes.size() - 1)).ok());
    const absl::Status s = decoder.Finish().status();
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("short.st"));
  }
  {
    SafetensorsDecoder decoder(bytes.size() - 4, "long.st");
    EXPECT_TRUE(absl::IsDataLoss(decoder.Consume(bytes)));
    EXPECT_TRUE(absl::IsDataLoss(decoder.Finish().status()));
  }
  {
    std::string bad = bytes;
    bad[10] = '!';  // inside the JSON
    SafetensorsDecoder decoder(bad.size(), "bad.st");
    EXPECT_TRUE(absl::IsDataLoss(decoder.Consume(bad)));
    // Refuses everything after an error.
    EXPECT_FALSE(decoder.Consume("").ok());
  }
  {
    // A length prefix larger than the file.
    std::string huge = bytes;
    huge[7] = '\x7f';
    SafetensorsDecoder decoder(huge.size(), "huge.st");
    EXPECT_TRUE(absl::IsDataLoss(decoder.Consume(huge.substr(0, 8))));
  }
}

TEST(Sha256Test, IncrementalMatchesOneShot) {
  std::string data;
  for (int i = 0; i < 100000; ++i) data.push_back(static_cast<char>(i * 7));
  storage::Sha256 digest;
  for (size_t at = 0; at < data.size(); at += 999) {
    digest.Update(std::string_view(data).substr(at, 999));
  }
  EXPECT_EQ(digest.Finish(), storage::Sha256Hex(data));
  EXPECT_EQ(storage::Sha256().Finish(), storage::Sha256Hex(""));
}

}  // namespace
}  // namespace gpipe
