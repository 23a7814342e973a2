// Numeric arrays from files: .npy in every supported dtype and version, one
// tensor of a .safetensors file in any dtype, the conversions to float32
// and int32, and malformed or unsupported files refused naming the file.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/npy.h"
#include "services/data/numeric_array.h"
#include "services/data/safetensors_array.h"
#include "services/storage/safetensors.h"

namespace gpipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  std::string out(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// A .npy file as np.save writes it: the dict padded with spaces to a
// 64-byte boundary and ended with '\n'.
std::string Npy(const std::string& descr, const std::string& shape,
                const std::string& data, const std::string& fortran = "False",
                int major = 1) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + fortran +
                     ", 'shape': " + shape + ", }";
  const size_t preamble = major == 1 ? 10 : 12;
  while ((preamble + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < preamble - 8; ++i) {
    out += static_cast<char>((dict.size() >> (8 * i)) & 0xff);
  }
  return out + dict + data;
}

struct Stored {
  std::string name, dtype, shape;  // shape as JSON, "[2,3]"
  std::string data;
};

// A safetensors file with any dtypes, its header written by hand.
std::string Safetensors(const std::vector<Stored>& tensors) {
  std::string json = "{";
  size_t offset = 0;
  for (const Stored& t : tensors) {
    if (json.size() > 1) json += ',';
    json += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype +
            "\",\"shape\":" + t.shape + ",\"data_offsets\":[" +
            std::to_string(offset) + "," +
            std::to_string(offset + t.data.size()) + "]}";
    offset += t.data.size();
  }
  json += '}';
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out += static_cast<char>((json.size() >> (8 * i)) & 0xff);
  }
  out += json;
  for (const Stored& t : tensors) out += t.data;
  return out;
}

class NumericArrayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("numeric_array_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  // The message of reading `content` as a .npy file, which must fail.
  std::string NpyError(const std::string& content) {
    const std::string path = Write("bad.npy", content);
    absl::StatusOr<NumericArray> a = ReadNpy(path);
    EXPECT_FALSE(a.ok());
    if (a.ok()) return "";
    EXPECT_TRUE(absl::IsInvalidArgument(a.status())) << a.status();
    EXPECT_THAT(a.status().message(), HasSubstr(path));
    return std::string(a.status().message());
  }
  std::filesystem::path dir_;
};

TEST_F(NumericArrayTest, ReadsEveryNpyDtype) {
  struct Case {
    std::string descr;
    std::string data;  // two elements
    ElementType type;
    std::vector<float> as_float;
  };
  const Case cases[] = {
      {"<f4", Bytes<float>({1.5f, -2}), ElementType::kF32, {1.5f, -2}},
      {"<f8", Bytes<double>({0.25, 3}), ElementType::kF64, {0.25f, 3}},
      {"<f2",
       Bytes<uint16_t>({0x3C00, 0x0001}),
       ElementType::kF16,
       {1, std::ldexp(1.0f, -24)}},
      {"|u1", Bytes<uint8_t>({0, 255}), ElementType::kU8, {0, 255}},
      {"|i1", Bytes<int8_t>({-128, 127}), ElementType::kI8, {-128, 127}},
      {"<i2", Bytes<int16_t>({-300, 7}), ElementType::kI16, {-300, 7}},
      {"<u2", Bytes<uint16_t>({65535, 1}), ElementType::kU16, {65535, 1}},
      {"<i4", Bytes<int32_t>({-70000, 9}), ElementType::kI32, {-70000, 9}},
      {"=i4", Bytes<int32_t>({5, -5}), ElementType::kI32, {5, -5}},
      {"<u4", Bytes<uint32_t>({70000, 0}), ElementType::kU32, {70000, 0}},
      {"<i8", Bytes<int64_t>({-1, 1 << 20}), ElementType::kI64, {-1, 1 << 20}},
      {"<u8", Bytes<uint64_t>({2, 3}), ElementType::kU64, {2, 3}},
      {"|b1", Bytes<uint8_t>({1, 0}), ElementType::kBool, {1, 0}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.descr);
    auto a = ReadNpy(Write("a.npy", Npy(c.descr, "(2,)", c.data)));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->type, c.type);
    EXPECT_THAT(a->shape, ElementsAre(2));
    auto f = ToFloat32(*a);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(*f, c.as_float);
    auto i = ToInt32(*a, "ids");
    if (IsFloating(c.type)) {
      EXPECT_THAT(i.status().message(),
                  HasSubstr(std::string("must be integer ids, got ") +
                            std::string(ElementTypeName(c.type))));
    } else {
      ASSERT_TRUE(i.ok()) << i.status();
      EXPECT_EQ((*i)[0], static_cast<int32_t>(c.as_float[0]));
      EXPECT_EQ((*i)[1], static_cast<int32_t>(c.as_float[1]));
    }
  }
}

TEST_F(NumericArrayTest, NpyVersionsAndShapes) {
  for (int major : {1, 2, 3}) {
    SCOPED_TRACE(major);
    std::vector<int32_t> v(24);
    for (int k = 0; k < 24; ++k) v[k] = k;
    auto a = ReadNpy(
        Write("v.npy", Npy("<i4", "(2, 3, 4)", Bytes(v), "False", major)));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_THAT(a->shape, ElementsAre(2, 3, 4));
    EXPECT_EQ(a->numel(), 24);
    EXPECT_EQ(ToInt32(*a, "ids")->at(23), 23);
  }
  auto scalar = ReadNpy(Write("s.npy", Npy("<f4", "()", Bytes<float>({7}))));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->numel(), 1);
  auto empty = ReadNpy(Write("e.npy", Npy("<f4", "(0, 3)", "")));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_THAT(empty->shape, ElementsAre(0, 3));
  EXPECT_EQ(empty->numel(), 0);
}

TEST_F(NumericArrayTest, MalformedNpyIsRefused) {
  const std::string six = Bytes<float>({1, 2, 3, 4, 5, 6});
  EXPECT_THAT(NpyError("PK\x03\x04 not numpy at all"),
              HasSubstr("not a .npy file"));
  EXPECT_THAT(NpyError(Npy("<f4", "(2, 3)", six.substr(0, 12))),
              HasSubstr("truncated: the header promises 24 bytes of data, the "
                        "file has 12"));
  EXPECT_THAT(
      NpyError(Npy("<f4", "(2, 3)", six + six)),
      HasSubstr("the header promises 24 bytes of data, the file has 48"));
  EXPECT_THAT(NpyError(Npy("<f4", "(2, 3)", six).substr(0, 30)),
              HasSubstr("truncated: the header is"));
  EXPECT_THAT(NpyError(std::string("\x93NUMPY\x01", 7)),
              HasSubstr("truncated"));
  const std::string big_endian = NpyError(Npy(">f4", "(2, 3)", six));
  EXPECT_THAT(big_endian, HasSubstr("big-endian dtype '>f4'"));
  EXPECT_THAT(big_endian, HasSubstr("astype('<f4')"));
  EXPECT_THAT(NpyError(Npy("<f4", "(2, 3)", six, "True")),
              HasSubstr("fortran_order arrays are not supported; save with "
                        "np.ascontiguousarray"));
  EXPECT_THAT(NpyError(Npy("|O", "(2,)", std::string(16, '\0'))),
              HasSubstr("dtype '|O' (object arrays) is not supported"));
  EXPECT_THAT(NpyError(Npy("<U5", "(2,)", std::string(40, '\0'))),
              HasSubstr("(strings) is not supported"));
  EXPECT_THAT(NpyError(Npy("<c8", "(1,)", std::string(8, '\0'))),
              HasSubstr("complex"));
  EXPECT_THAT(NpyError(Npy("|f4", "(2, 3)", six)), HasSubstr("byte order '|'"));
  // A structured dtype's descr is a list of fields.
  std::string structured = Npy("<f4", "(2, 3)", six);
  structured.replace(structured.find("'<f4'"), 5, "[('a', '<f4')]");
  EXPECT_THAT(NpyError(structured), HasSubstr("structured dtypes"));
  std::string no_shape = Npy("<f4", "(2, 3)", six);
  no_shape.replace(no_shape.find("'shape'"), 7, "'shope'");
  EXPECT_THAT(NpyError(no_shape), HasSubstr("unexpected key 'shope'"));
  std::string bad_bool = Npy("<f4", "(2, 3)", six, "Maybe");
  EXPECT_THAT(NpyError(bad_bool), HasSubstr("not True or False"));
  EXPECT_THAT(NpyError(Npy("<f4", "(2, -3)", six)),
              HasSubstr("non-negative integer"));
  EXPECT_THAT(NpyError(Npy("<f4", "(9999999999, 9999999999, 9999999999)", six)),
              HasSubstr("too many"));
  std::string version = Npy("<f4", "(2, 3)", six);
  version[6] = 4;
  EXPECT_THAT(NpyError(version), HasSubstr("format version 4.0"));
  std::string long_header = Npy("<f4", "(2, 3)", six, "False", 2);
  long_header[11] = 0x7f;  // a 2 GB header
  EXPECT_THAT(NpyError(long_header), HasSubstr("header length"));

  absl::StatusOr<NumericArray> missing =
      ReadNpy((dir_ / "missing.npy").string());
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.npy"));
}

TEST_F(NumericArrayTest, ConversionsCheckEveryValue) {
  NumericArray wide;
  wide.type = ElementType::kI64;
  wide.shape = {2, 2};
  wide.data = [] {
    std::string b = Bytes<int64_t>({1, 2, 3, 3000000000LL});
    return std::vector<uint8_t>(b.begin(), b.end());
  }();
  auto i = ToInt32(wide, "class ids");
  EXPECT_THAT(i.status().message(),
              HasSubstr("value 3000000000 at flat index 3 (sample 1) does "
                        "not fit int32"));
  EXPECT_TRUE(ToFloat32(wide).ok());  // large ints round, they do not fail

  NumericArray negative = wide;
  negative.type = ElementType::kU64;
  std::string b = Bytes<uint64_t>({0, 1, 2, 18446744073709551615ULL});
  negative.data.assign(b.begin(), b.end());
  EXPECT_THAT(ToInt32(negative, "ids").status().message(),
              HasSubstr("value 18446744073709551615"));

  NumericArray doubles;
  doubles.type = ElementType::kF64;
  doubles.shape = {3};
  b = Bytes<double>({1, 1e300, 2});
  doubles.data.assign(b.begin(), b.end());
  EXPECT_THAT(ToFloat32(doubles).status().message(),
              HasSubstr("1e+300 is beyond float32's range at sample 1"));

  NumericArray floats;
  floats.type = ElementType::kF32;
  floats.shape = {2, 3};
  b = Bytes<float>({0, 1, 2, 3, NAN, 5});
  floats.data.assign(b.begin(), b.end());
  EXPECT_THAT(ToFloat32(floats).status().message(),
              HasSubstr("value nan is not finite at flat index 4 (sample 1)"));
  EXPECT_THAT(ToInt32(floats, "class ids").status().message(),
              HasSubstr("must be integer class ids, got float32"));

  NumericArray bf16;
  bf16.type = ElementType::kBF16;
  bf16.shape = {2};
  b = Bytes<uint16_t>({0x3F80, 0xC040});  // 1 and -3
  bf16.data.assign(b.begin(), b.end());
  EXPECT_THAT(*ToFloat32(bf16), ElementsAre(1.0f, -3.0f));
}

TEST_F(NumericArrayTest, OneTensorOfASafetensorsFile) {
  const Tensor x = Tensor::FromVector(Shape{2, 2}, {1, 2, 3, 4});
  const Tensor y = Tensor::FromInts(Shape{2}, {7, -1});
  const std::string path = (dir_ / "d.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(path, {{"x", &x}, {"y", &y}}).ok());
  auto a = ReadSafetensorsArray(path, "x");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->type, ElementType::kF32);
  EXPECT_THAT(a->shape, ElementsAre(2, 2));
  EXPECT_THAT(*ToFloat32(*a), ElementsAre(1, 2, 3, 4));
  auto t = ReadSafetensorsArray(path, "y");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(*ToInt32(*t, "ids"), ElementsAre(7, -1));

  const std::string missing =
      std::string(ReadSafetensorsArray(path, "targets").status().message());
  EXPECT_THAT(missing, HasSubstr(path));
  EXPECT_THAT(missing, HasSubstr("no tensor \"targets\""));
  EXPECT_THAT(missing, HasSubstr("\"x\", \"y\""));
}

TEST_F(NumericArrayTest, SafetensorsInEveryDtype) {
  const std::string path =
      Write("all.safetensors",
            Safetensors({
                {"i64", "I64", "[2]", Bytes<int64_t>({-5, 1LL << 40})},
                {"f64", "F64", "[1,2]", Bytes<double>({0.5, -8})},
                {"u8", "U8", "[3]", Bytes<uint8_t>({1, 2, 255})},
                {"bool", "BOOL", "[2]", Bytes<uint8_t>({0, 1})},
                {"i16", "I16", "[1]", Bytes<int16_t>({-7})},
                {"u32", "U32", "[1]", Bytes<uint32_t>({4000000000u})},
                {"f16", "F16", "[1]", Bytes<uint16_t>({0xC000})},  // -2
                {"f8", "F8_E4M3", "[2]", Bytes<uint8_t>({0, 0})},
            }));
  auto i64 = ReadSafetensorsArray(path, "i64");
  ASSERT_TRUE(i64.ok()) << i64.status();
  EXPECT_EQ(i64->type, ElementType::kI64);
  EXPECT_THAT(ToInt32(*i64, "ids").status().message(),
              HasSubstr("value 1099511627776 at sample 1"));
  auto f64 = ReadSafetensorsArray(path, "f64");
  ASSERT_TRUE(f64.ok()) << f64.status();
  EXPECT_THAT(f64->shape, ElementsAre(1, 2));
  EXPECT_THAT(*ToFloat32(*f64), ElementsAre(0.5f, -8.0f));
  EXPECT_THAT(*ToInt32(*ReadSafetensorsArray(path, "u8"), "ids"),
              ElementsAre(1, 2, 255));
  EXPECT_THAT(*ToInt32(*ReadSafetensorsArray(path, "bool"), "ids"),
              ElementsAre(0, 1));
  EXPECT_THAT(*ToInt32(*ReadSafetensorsArray(path, "i16"), "ids"),
              ElementsAre(-7));
  EXPECT_THAT(*ToFloat32(*ReadSafetensorsArray(path, "u32")),
              ElementsAre(4e9f));
  EXPECT_THAT(*ToFloat32(*ReadSafetensorsArray(path, "f16")),
              ElementsAre(-2.0f));
  EXPECT_THAT(ReadSafetensorsArray(path, "f8").status().message(),
              HasSubstr("dtype F8_E4M3 is not supported"));
}

TEST_F(NumericArrayTest, MalformedSafetensorsAreRefused) {
  const std::string good =
      Safetensors({{"x", "I64", "[2]", Bytes<int64_t>({1, 2})}});
  auto error = [&](const std::string& content) {
    const std::string path = Write("bad.safetensors", content);
    absl::StatusOr<NumericArray> a = ReadSafetensorsArray(path, "x");
    EXPECT_TRUE(absl::IsInvalidArgument(a.status())) << a.status();
    EXPECT_THAT(a.status().message(), HasSubstr(path));
    return std::string(a.status().message());
  };
  ASSERT_TRUE(ReadSafetensorsArray(Write("good.safetensors", good), "x").ok());
  EXPECT_THAT(error(good.substr(0, good.size() - 4)),
              HasSubstr("do not hold I64 [2] (16 bytes)"));
  EXPECT_THAT(error(good.substr(0, 5)), HasSubstr("too short"));
  EXPECT_THAT(error(good.substr(0, 20)), HasSubstr("file truncated?"));
  EXPECT_THAT(error(Safetensors({{"x", "Q7", "[2]", std::string(16, 0)}})),
              HasSubstr("unknown dtype \"Q7\""));
  EXPECT_THAT(error(Safetensors({{"x", "I64", "[3]", std::string(16, 0)}})),
              HasSubstr("do not hold I64 [3]"));
  std::string not_json = good;
  not_json[8] = '[';
  EXPECT_THAT(error(not_json), HasSubstr("malformed header"));
}

// Every byte is untrusted: each shorter prefix of a good file is refused,
// and a corrupted header byte gives an array or an error, never a crash.
TEST_F(NumericArrayTest, EveryTruncationAndCorruptionIsHandled) {
  const std::string npy =
      Npy("<i8", "(3, 2)", Bytes<int64_t>({1, 2, 3, 4, 5, 6}));
  const std::string st =
      Safetensors({{"x", "I64", "[3,2]", Bytes<int64_t>({1, 2, 3, 4, 5, 6})}});
  for (size_t n = 0; n < npy.size(); ++n) {
    EXPECT_FALSE(ReadNpy(Write("p.npy", npy.substr(0, n))).ok()) << n;
  }
  for (size_t n = 0; n < st.size(); ++n) {
    EXPECT_FALSE(
        ReadSafetensorsArray(Write("p.safetensors", st.substr(0, n)), "x").ok())
        << n;
  }
  int read = 0;
  for (size_t i = 0; i < 80; ++i) {
    for (char c : {'\0', '\xff', '(', ')', '\'', ',', '9', '}', ' '}) {
      std::string bad = npy;
      bad[i] = c;
      read += ReadNpy(Write("c.npy", bad)).ok();
      bad = st;
      bad[i] = c;
      read += ReadSafetensorsArray(Write("c.safetensors", bad), "x").ok();
    }
  }
  EXPECT_GT(read, 0);  // some corruptions are harmless (padding, digits)
}

}  // namespace
}  // namespace gpipe
