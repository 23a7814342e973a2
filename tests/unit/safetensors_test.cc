// safetensors: bitwise round trips, the on-disk layout, atomic replacement,
// DataLoss with a useful message for each kind of corruption, random
// mutations that must never crash, and agreement with an independent Python
// reader.
#include "services/storage/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// The 8-byte little-endian length, `json`, then `data`.
std::string Framed(const std::string& json, const std::string& data = "") {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>((uint64_t{json.size()} >> (8 * i)) & 0xFF);
  }
  return out + json + data;
}

std::string Bytes(size_t n) { return std::string(n, '\x01'); }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::path(::testing::TempDir()) / "safetensors_XXXXXX")
            .string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::vector<std::string> DirEntries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
};

// Expects DataLoss whose message starts with the file's name and contains
// `needle`.
void ExpectDataLoss(const std::string& bytes, const std::string& needle) {
  const absl::StatusOr<SafetensorsFile> file =
      ParseSafetensors(bytes, "model.safetensors");
  ASSERT_FALSE(file.ok()) << "accepted: " << needle;
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << file.status();
  EXPECT_THAT(std::string(file.status().message()),
              StartsWith("model.safetensors: "));
  EXPECT_THAT(std::string(file.status().message()), HasSubstr(needle));
}

TEST_F(SafetensorsTest, RoundTripIsBitwiseEqual) {
  const float nan_payload = FromBits(0x7fc12345);
  const float denormal = FromBits(0x00000001);
  const Tensor matrix = Tensor::FromVector(
      {2, 3}, {1.5f, -0.0f, nan_payload, denormal,
               std::numeric_limits<float>::infinity(), -3.25e-7f});
  const Tensor ids =
      Tensor::FromInts({4}, {0, -1, 2147483647, -2147483647 - 1});
  const Tensor scalar = Tensor::FromVector({}, {42.0f});
  const Tensor empty_f32 = Tensor::Zeros({0, 5});
  const Tensor empty_i32 = Tensor::Zeros({3, 0, 2}, DType::kI32);
  const Tensor cube = Tensor::FromInts({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const std::string odd_name = "quote\" back\\slash\nnew\x01line é 𝄞";
  const std::vector<std::pair<std::string, const Tensor*>> tensors = {
      {"layers.1.weight", &matrix}, {"ids", &ids},
      {"scalar", &scalar},          {"empty.f32", &empty_f32},
      {"empty.i32", &empty_i32},    {odd_name, &cube}};
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"note", "tab\tquote\" \\ \x7f \x1f ünïcödé 中文 🙂"},
      {"", "empty key"}};
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, metadata).ok());

  for (const bool from_disk : {true, false}) {
    SCOPED_TRACE(from_disk ? "ReadSafetensors" : "ParseSafetensors");
    const absl::StatusOr<SafetensorsFile> file =
        from_disk ? ReadSafetensors(path)
                  : ParseSafetensors(ReadAll(path), "model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(file->metadata, metadata);
    ASSERT_EQ(file->tensors.size(), tensors.size());
    for (const auto& [name, tensor] : tensors) {
      const auto it = file->tensors.find(name);
      ASSERT_NE(it, file->tensors.end()) << name;
      EXPECT_TRUE(BitwiseEqual(it->second, *tensor))
          << name << " " << it->second.shape().ToString();
      EXPECT_EQ(it->second.device(), Device::kCpu);
    }
  }
}

TEST_F(SafetensorsTest, NoTensorsRoundTrips) {
  const std::string path = Path("empty.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}).ok());
  EXPECT_EQ(ReadAll(path), Framed("{}      "));
  const absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors.empty());
  EXPECT_TRUE(file->metadata.empty());
}

TEST_F(SafetensorsTest, LayoutIsAlignedAndSortedByName) {
  const Tensor a = Tensor::FromVector({3}, {1, 2, 3});
  const Tensor b = Tensor::FromInts({1}, {7});
  // Names of every length mod 8 move the header end through every residue.
  for (int len = 1; len <= 16; ++len) {
    SCOPED_TRACE(len);
    const std::string path = Path("aligned.safetensors");
    ASSERT_TRUE(
        WriteSafetensors(path, {{"z", &b}, {std::string(len, 'a'), &a}}).ok());
    const std::string bytes = ReadAll(path);
    ASSERT_GE(bytes.size(), 8u);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) {
      n |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
    }
    EXPECT_EQ((8 + n) % 8, 0u);
    ASSERT_EQ(bytes.size(), 8 + n + 16);
    const std::string json = bytes.substr(8, n);
    EXPECT_EQ(json.find_last_not_of(' '), json.rfind('}'));
    // Data in name order: a (12 bytes) then z (4 bytes).
    EXPECT_LT(json.find(std::string(len, 'a')), json.find("\"z\""));
    EXPECT_THAT(json, HasSubstr("\"data_offsets\":[0,12]"));
    EXPECT_THAT(json, HasSubstr("\"data_offsets\":[12,16]"));
    EXPECT_EQ(bytes.compare(8 + n, 12,
                            std::string(static_cast<const char*>(a.raw()), 12)),
              0);
  }
}

TEST_F(SafetensorsTest, WriteIsAtomic) {
  const std::string path = Path("model.safetensors");
  const Tensor first = Tensor::FromVector({2}, {1, 2});
  const Tensor second = Tensor::FromVector({3}, {3, 4, 5});
  ASSERT_TRUE(WriteSafetensors(path, {{"w", &first}}).ok());
  ASSERT_TRUE(WriteSafetensors(path, {{"w", &second}}).ok());
  EXPECT_THAT(DirEntries(), ::testing::ElementsAre("model.safetensors"));
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(BitwiseEqual(file->tensors.at("w"), second));

  // A stale temporary file from a crashed run is replaced, not appended to.
  const std::string stale = path + ".tmp." + std::to_string(::getpid());
  WriteAll(stale, "garbage from a crash");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", &first}}).ok());
  EXPECT_THAT(DirEntries(), ::testing::ElementsAre("model.safetensors"));
  file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(BitwiseEqual(file->tensors.at("w"), first));

  // A write that fails leaves no file behind.
  EXPECT_FALSE(
      WriteSafetensors(Path("no/such/dir/x.safetensors"), {{"w", &first}})
          .ok());
  EXPECT_THAT(DirEntries(), ::testing::ElementsAre("model.safetensors"));
}

TEST_F(SafetensorsTest, InvalidTensorsAreRejectedAndNothingIsWritten) {
  const std::string path = Path("bad.safetensors");
  const Tensor t = Tensor::FromVector({1}, {1});
  const Tensor undefined;
  const std::vector<std::vector<std::pair<std::string, const Tensor*>>> cases =
      {{{"w", &t}, {"v", &t}, {"w", &t}},
       {{"", &t}},
       {{"__metadata__", &t}},
       {{"w", nullptr}},
       {{"w", &undefined}},
       {{"bad\xff utf8", &t}}};
  for (const auto& tensors : cases) {
    const absl::Status s = WriteSafetensors(path, tensors);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  const absl::Status dup = WriteSafetensors(path, cases[0]);
  EXPECT_THAT(std::string(dup.message()), HasSubstr("\"w\" appears twice"));
  EXPECT_EQ(WriteSafetensors(path, {{"w", &t}}, {{"k", "bad\xc3"}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(DirEntries().empty());
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadSafetensors(Path("absent")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadSafetensors(dir_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, TruncatedFileIsDataLoss) {
  const std::string path = Path("model.safetensors");
  const Tensor t = Tensor::FromVector({4}, {1, 2, 3, 4});
  ASSERT_TRUE(WriteSafetensors(path, {{"w", &t}}).ok());
  const std::string bytes = ReadAll(path);
  ExpectDataLoss(bytes.substr(0, bytes.size() - 1), "out of range");
  ExpectDataLoss(bytes.substr(0, 20), "header length");
  ExpectDataLoss(bytes.substr(0, 5), "too short");
  ExpectDataLoss("", "too short");

  WriteAll(path, bytes.substr(0, bytes.size() - 4));
  const absl::Status s = ReadSafetensors(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), StartsWith(path + ": "));
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFileIsDataLoss) {
  std::string bytes = Framed("{}");
  bytes[0] = 100;
  ExpectDataLoss(bytes, "header length 100 is more than the 2 bytes");
  bytes = Framed("{}");
  bytes[3] = 0x7f;  // ~2 GB
  ExpectDataLoss(bytes, "exceeds the limit");
  ExpectDataLoss(std::string(8, '\xff') + "{}", "exceeds the limit");
}

TEST_F(SafetensorsTest, InvalidJsonIsDataLoss) {
  const std::string entry =
      R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::vector<std::string> bad = {
      "",
      "{",
      "[]",
      "\"str\"",
      "{} x",
      "{}{}",
      R"({"a":)" + entry + ",}",
      R"({"a" )" + entry + "}",
      R"({"a":)" + entry,
      R"({'a':)" + entry + "}",
      R"({"a\x":)" + entry + "}",
      R"({"a\ud800":)" + entry + "}",
      R"({"a\udc00":)" + entry + "}",
      R"({"a\u12":)" + entry + "}",
      "{\"a\x01\":" + entry + "}",
      "{\"a\xc3\":" + entry + "}",
      "{\"a\xed\xa0\x80\":" + entry + "}",  // UTF-8 encoded surrogate
      "{\"a\xc0\xaf\":" + entry + "}",      // overlong
      R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[1e0],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[1,],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[,1],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[1 1],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":null,"shape":[1],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}})",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551616]}})",
      R"({"a":{"dtype":"F32","shape":[1]}})",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})",
      R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
      R"({"a":)" + entry + R"(,"__metadata__":{"k":1}})",
      R"({"a":)" + entry + R"(,"__metadata__":"k"})",
      R"({"a":)" + entry + R"(,"__metadata__":{"k":"v","k":"w"}})",
      R"({"a":)" + entry + R"(,"a":)" + entry + "}",
      R"({"":)" + entry + "}",
      R"({"a":[]})",
  };
  for (const std::string& json : bad) {
    SCOPED_TRACE(json);
    ExpectDataLoss(Framed(json, Bytes(4)), "");
  }
  ExpectDataLoss(Framed(R"({"a" 1})", Bytes(4)),
                 "invalid JSON at byte 5: expected ':'");
  ExpectDataLoss(Framed(R"({"a":)" + entry + ",}", Bytes(4)),
                 "expected a string");
  ExpectDataLoss(Framed(R"({"w":{"dtype":"F32","shape":[-1]}})", Bytes(4)),
                 "tensor \"w\": \"shape\" holds something other than");
}

TEST_F(SafetensorsTest, WellFormedJsonVariantsAreAccepted) {
  // Whitespace anywhere, escapes, \u pairs, members in any order.
  const std::string json =
      " \t\n{ \"__metadata__\" : { \"k\\u00e9\\ud834\\udd1e\\/\" : \"v\\n\" } "
      ", \"b\" : { \"data_offsets\" : [ 4 , 12 ] , \"shape\" : [ 2 ] , "
      "\"dtype\" : \"I32\" } , \"a\":{\"shape\":[],\"dtype\":\"F32\","
      "\"data_offsets\":[0,4]}}\r\n   ";
  const absl::StatusOr<SafetensorsFile> file =
      ParseSafetensors(Framed(json, Bytes(12)), "x");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("k\xc3\xa9\xf0\x9d\x84\x9e/"), "v\n");
  EXPECT_EQ(file->tensors.at("a").shape(), Shape({}));
  EXPECT_EQ(file->tensors.at("b").dtype(), DType::kI32);
  EXPECT_EQ(file->tensors.at("b").i32()[1], 0x01010101);
}

TEST_F(SafetensorsTest, OffsetsOutOfRangeAreDataLoss) {
  ExpectDataLoss(
      Framed(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
             Bytes(8)),
      "tensor \"w\": data_offsets [0, 16] out of range for a data buffer of 8 "
      "bytes");
  ExpectDataLoss(
      Framed(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})",
             Bytes(8)),
      "out of range");
}

TEST_F(SafetensorsTest, OffsetsNotMatchingShapeAreDataLoss) {
  const absl::StatusOr<SafetensorsFile> file = ParseSafetensors(
      Framed(R"({"layers.0.weight":{"dtype":"F32","shape":[2,2],)"
             R"("data_offsets":[0,12]}})",
             Bytes(12)),
      "model.safetensors");
  EXPECT_EQ(file.status(),
            absl::DataLossError(
                "model.safetensors: tensor \"layers.0.weight\": data_offsets "
                "[0, 12] do not match shape [2, 2] (16 bytes)"));
  ExpectDataLoss(
      Framed(R"({"w":{"dtype":"I32","shape":[4294967296,4294967296,0],)"
             R"("data_offsets":[0,0]}})"),
      "too many elements");
  ExpectDataLoss(Framed(R"({"w":{"dtype":"F64","shape":[4611686018427387904],)"
                        R"("data_offsets":[0,0]}})"),
                 "more than 2^64 bytes");
}

TEST_F(SafetensorsTest, OverlapsGapsAndUncoveredBytesAreDataLoss) {
  ExpectDataLoss(
      Framed(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
             Bytes(12)),
      "tensors \"a\" and \"b\" overlap: data_offsets [0, 8] and [4, 12]");
  ExpectDataLoss(
      Framed(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
             Bytes(8)),
      "overlap");
  ExpectDataLoss(
      Framed(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
             Bytes(12)),
      "gap in the data buffer: bytes [4, 8)");
  ExpectDataLoss(
      Framed(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
             Bytes(12)),
      "data buffer has 12 bytes but the tensors cover only 4");
}

TEST_F(SafetensorsTest, UnknownDtypeIsDataLossAndUnsupportedIsUnimplemented) {
  ExpectDataLoss(
      Framed(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})",
             Bytes(4)),
      "tensor \"w\": unknown dtype \"Q7\"");
  const absl::Status s =
      ParseSafetensors(
          Framed(R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})",
                 Bytes(4)),
          "model.safetensors")
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tensor \"w\": dtype BF16 is not supported"));
  // A corrupt file stays DataLoss whatever its dtypes.
  ExpectDataLoss(
      Framed(R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})",
             Bytes(8)),
      "cover only");
}

// Random damage to a valid file: every result is a value or an error, never
// a crash or an out-of-bounds read (run under ASan to see the latter).
TEST_F(SafetensorsTest, RandomMutationsNeverCrash) {
  const Tensor a = Tensor::FromVector({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b = Tensor::FromInts({3}, {7, 8, 9});
  const Tensor c = Tensor::FromVector({}, {0.5f});
  const Tensor d = Tensor::Zeros({0, 2});
  const std::string path = Path("valid.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"a", &a}, {"b\\u", &b}, {"c", &c}, {"d", &d}},
                               {{"step", "12"}})
                  .ok());
  const std::string valid = ReadAll(path);
  uint64_t header_end = 8;
  for (int i = 0; i < 8; ++i) {
    header_end += uint64_t{static_cast<unsigned char>(valid[i])} << (8 * i);
  }
  constexpr std::string_view kJsonBytes = "{}[]\",:0123456789\\u \x80\xff";
  std::mt19937_64 rng(20240601);
  const auto below = [&](uint64_t n) {
    return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng);
  };
  int ok = 0, data_loss = 0, unimplemented = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = valid;
    const int mutations = 1 + below(3);
    for (int m = 0; m < mutations; ++m) {
      switch (below(6)) {
        case 0:  // truncate
          bytes.resize(below(bytes.size() + 1));
          break;
        case 1:  // random byte anywhere
          if (!bytes.empty()) bytes[below(bytes.size())] = below(256);
          break;
        case 2:  // JSON-ish byte in the header
          if (bytes.size() > 8) {
            bytes[8 + below(std::min<uint64_t>(bytes.size(), header_end) - 8)] =
                kJsonBytes[below(kJsonBytes.size())];
          }
          break;
        case 3:  // insert or delete a header byte
          if (bytes.size() > 8) {
            const size_t at =
                8 + below(std::min<uint64_t>(bytes.size(), header_end) - 8);
            if (below(2) == 0) {
              bytes.erase(at, 1);
            } else {
              bytes.insert(at, 1, kJsonBytes[below(kJsonBytes.size())]);
            }
          }
          break;
        case 4:  // a digit changed, moving offsets and dims
          for (int tries = 0; tries < 20 && bytes.size() > 8; ++tries) {
            const size_t at =
                8 + below(std::min<uint64_t>(bytes.size(), header_end) - 8);
            if (bytes[at] >= '0' && bytes[at] <= '9') {
              bytes[at] = '0' + below(10);
              break;
            }
          }
          break;
        case 5:  // the length prefix
          if (bytes.size() >= 8) bytes[below(8)] = below(256);
          break;
      }
    }
    // Exercise the file reader too, now and then.
    absl::StatusOr<SafetensorsFile> file;
    if (i % 50 == 0) {
      WriteAll(path, bytes);
      file = ReadSafetensors(path);
    } else {
      file = ParseSafetensors(bytes, "fuzz");
    }
    if (file.ok()) {
      ++ok;
      size_t total = 0;
      for (const auto& [name, t] : file->tensors) total += t.nbytes();
      EXPECT_LE(total, bytes.size());
    } else if (file.status().code() == absl::StatusCode::kDataLoss) {
      ++data_loss;
    } else if (file.status().code() == absl::StatusCode::kUnimplemented) {
      ++unimplemented;
    } else {
      ADD_FAILURE() << "unexpected status " << file.status();
    }
  }
  // Both outcomes occur, so the mutations reach past the first check.
  EXPECT_GT(ok, 0);
  EXPECT_GT(data_loss, 500);
  std::cout << "mutations: " << ok << " ok, " << data_loss << " DataLoss, "
            << unimplemented << " Unimplemented\n";
}

// Runs `command`, returning its exit status and standard output.
std::pair<int, std::string> RunCommand(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, out};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST_F(SafetensorsTest, IndependentPythonReaderAgrees) {
  if (RunCommand("python3 -c 'import json, struct' 2>/dev/null").first != 0) {
    GTEST_SKIP() << "python3 is not available";
  }
  const std::string script =
      std::string(GPIPE_SOURCE_DIR) + "/tests/scripts/read_safetensors.py";
  const Tensor weight =
      Tensor::FromVector({2, 3}, {0.5f, 1.25f, -2.0f, 3.0f, 0.25f, 1.0f});
  const Tensor bias = Tensor::FromVector({3}, {-1.5f, 0.0f, 0.75f});
  const Tensor labels = Tensor::FromInts({2, 2}, {1, -5, 100, 7});
  const Tensor step = Tensor::FromInts({}, {42});
  const Tensor none = Tensor::Zeros({0, 4});
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"layers.0.weight", &weight},
                                {"layers.0.bias", &bias},
                                {"labels", &labels},
                                {"step", &step},
                                {"none", &none}},
                               {{"epoch", "3"}})
                  .ok());
  const auto [rc, out] =
      RunCommand("python3 " + script + " " + path +
                 " --print --expect-names "
                 "layers.0.weight,layers.0.bias,labels,step,none");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("layers.0.weight F32 [2, 3] sum=4.0\n"));
  EXPECT_THAT(out, HasSubstr("layers.0.bias F32 [3] sum=-0.75\n"));
  EXPECT_THAT(out, HasSubstr("labels I32 [2, 2] sum=103\n"));
  EXPECT_THAT(out, HasSubstr("step I32 [] sum=42\n"));
  EXPECT_THAT(out, HasSubstr("none F32 [0, 4] sum=0.0\n"));
  EXPECT_THAT(out, HasSubstr("metadata \"epoch\" = \"3\"\n"));

  // It is a real check: wrong names, and a damaged file, fail.
  EXPECT_NE(RunCommand("python3 " + script + " " + path +
                       " --expect-names layers.0.weight 2>/dev/null")
                .first,
            0);
  const std::string bytes = ReadAll(path);
  WriteAll(path, bytes.substr(0, bytes.size() - 4));
  EXPECT_NE(RunCommand("python3 " + script + " " + path + " 2>/dev/null").first,
            0);
}

}  // namespace
}  // namespace gpipe
