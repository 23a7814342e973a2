// The IDX reader: round trips through gzip and plain files, and every way a
// file can be damaged ends in DataLoss (never a crash) naming the file.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/data/idx.h"

namespace gpipe {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<uint8_t> IdxBytes(int rank, const std::vector<uint32_t>& dims,
                              const std::vector<uint8_t>& values) {
  std::vector<uint8_t> b = {0, 0, 0x08, static_cast<uint8_t>(rank)};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) b.push_back(d >> shift);
  }
  b.insert(b.end(), values.begin(), values.end());
  return b;
}

std::vector<uint8_t> Gzip(const std::vector<uint8_t>& raw) {
  uLongf n = compressBound(raw.size()) + 64;
  std::vector<uint8_t> out(n);
  // deflateInit2 with windowBits 16+15 writes a gzip wrapper, as gzwrite does.
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY),
            Z_OK);
  z.next_in = const_cast<uint8_t*>(raw.data());
  z.avail_in = raw.size();
  z.next_out = out.data();
  z.avail_out = out.size();
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("idx_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::vector<uint8_t>& b) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), b.size());
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(IdxTest, GzipRoundTrip) {
  std::vector<uint8_t> pixels(3 * 2 * 4);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = 10 * i;
  const std::string images =
      Write("images.gz", Gzip(IdxBytes(3, {3, 2, 4}, pixels)));
  const std::string labels =
      Write("labels.gz", Gzip(IdxBytes(1, {3}, {7, 0, 9})));

  auto a = ReadIdx(images, 3);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(3, 2, 4));
  EXPECT_THAT(a->values, ElementsAreArray(pixels));
  auto l = ReadIdx(labels, 1);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_THAT(l->dims, ElementsAre(3));
  EXPECT_THAT(l->values, ElementsAre(7, 0, 9));
}

TEST_F(IdxTest, PlainFileWorksToo) {
  const std::string path = Write("labels", IdxBytes(1, {4}, {1, 2, 3, 4}));
  auto l = ReadIdx(path, 1);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_THAT(l->values, ElementsAre(1, 2, 3, 4));
}

TEST_F(IdxTest, EmptyArray) {
  auto l = ReadIdx(Write("empty.gz", Gzip(IdxBytes(1, {0}, {}))), 1);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_THAT(l->dims, ElementsAre(0));
  EXPECT_TRUE(l->values.empty());
}

TEST_F(IdxTest, MissingFileIsNotFound) {
  const std::string path = (dir_ / "nope.gz").string();
  auto r = ReadIdx(path, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(path));
}

void ExpectDataLoss(const absl::StatusOr<IdxArray>& r, const std::string& path,
                    const std::string& why = "") {
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(path));
  EXPECT_THAT(r.status().message(), HasSubstr(why));
}

TEST_F(IdxTest, TruncatedDataIsDataLoss) {
  std::vector<uint8_t> b = IdxBytes(3, {3, 2, 2}, std::vector<uint8_t>(12, 5));
  b.resize(b.size() - 2);
  ExpectDataLoss(ReadIdx(Write("short.gz", Gzip(b)), 3), "short.gz",
                 "truncated");
  ExpectDataLoss(ReadIdx(Write("short", b), 3), "short", "truncated");
}

TEST_F(IdxTest, TruncatedHeaderIsDataLoss) {
  std::vector<uint8_t> b = IdxBytes(3, {3, 2, 2}, {});
  for (size_t keep : {0, 2, 4, 9}) {
    b.resize(keep);
    const std::string name = "header" + std::to_string(keep);
    ExpectDataLoss(ReadIdx(Write(name, b), 3), name);
  }
}

TEST_F(IdxTest, TruncatedGzipStreamIsDataLoss) {
  std::vector<uint8_t> pixels(5000);
  Rng rng(1);
  for (uint8_t& p : pixels) p = rng.Below(256);
  std::vector<uint8_t> gz = Gzip(IdxBytes(3, {5, 10, 100}, pixels));
  for (size_t keep : {gz.size() / 2, gz.size() - 4, gz.size() - 1}) {
    std::vector<uint8_t> cut(gz.begin(), gz.begin() + keep);
    const std::string name = "cut" + std::to_string(keep) + ".gz";
    ExpectDataLoss(ReadIdx(Write(name, cut), 3), name);
  }
}

TEST_F(IdxTest, CorruptGzipIsDataLoss) {
  std::vector<uint8_t> pixels(5000, 42);
  std::vector<uint8_t> gz = Gzip(IdxBytes(3, {5, 10, 100}, pixels));
  // Flip bytes in the deflate stream and, separately, in the CRC trailer.
  for (size_t at : {gz.size() / 2, gz.size() - 6}) {
    std::vector<uint8_t> bad = gz;
    bad[at] ^= 0x5a;
    const std::string name = "flip" + std::to_string(at) + ".gz";
    ExpectDataLoss(ReadIdx(Write(name, bad), 3), name);
  }
}

TEST_F(IdxTest, TrailingBytesAreDataLoss) {
  const std::string path =
      Write("long.gz", Gzip(IdxBytes(1, {3}, {1, 2, 3, 4})));
  ExpectDataLoss(ReadIdx(path, 1), "long.gz", "trailing");
}

TEST_F(IdxTest, BadMagicIsDataLoss) {
  std::vector<uint8_t> b = IdxBytes(1, {2}, {1, 2});
  b[2] = 0x0d;  // float data: not ours
  ExpectDataLoss(ReadIdx(Write("float.gz", Gzip(b)), 1), "float.gz", "magic");
  // A labels file where images are expected.
  const std::string labels = Write("labels.gz", Gzip(IdxBytes(1, {2}, {1, 2})));
  ExpectDataLoss(ReadIdx(labels, 3), "labels.gz", "magic");
}

TEST_F(IdxTest, HugeDimensionsFailWithoutAllocating) {
  const std::string path =
      Write("huge", IdxBytes(3, {0xffffffffu, 0xffffffffu, 2}, {1, 2, 3}));
  ExpectDataLoss(ReadIdx(path, 3), "huge");
  // Large but not absurd: 4 GB announced, 3 bytes present.
  const std::string big =
      Write("big", IdxBytes(3, {1u << 20, 64, 64}, {1, 2, 3}));
  ExpectDataLoss(ReadIdx(big, 3), "big", "truncated");
}

TEST_F(IdxTest, RandomBytesNeverCrash) {
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> b(rng.Below(64));
    for (uint8_t& x : b) x = rng.Below(256);
    // Half the trials start with a valid magic so the dims get parsed.
    if (trial % 2 == 0 && b.size() >= 4) {
      b[0] = 0;
      b[1] = 0;
      b[2] = 8;
      b[3] = 1 + rng.Below(3);
    }
    if (trial % 3 == 0) b = Gzip(b);
    const std::string path = Write("random", b);
    for (int rank = 1; rank <= 3; ++rank) {
      auto r = ReadIdx(path, rank);
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
      }
    }
  }
}

}  // namespace
}  // namespace gpipe
