// Image files for predict (services/data/image_file.h): PNG of every kind
// libpng writes, JPEG, PGM, told apart by their bytes and decoded to the
// channels a model takes; damaged, truncated and oversized files are
// refused naming the file, without a crash.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/image_file.h"
#include "tests/support/image_encode.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;
using testing_images::EncodeJpeg;
using testing_images::EncodePng;
using testing_images::EncodePng16;

// A 5 x 3 test card: value (7 * i + 13 * c) % 256 at pixel i, channel c.
std::vector<uint8_t> Card(int channels) {
  std::vector<uint8_t> p(15 * channels);
  for (int i = 0; i < 15; ++i)
    for (int c = 0; c < channels; ++c)
      p[i * channels + c] = static_cast<uint8_t>((7 * i * 40 + 13 * c) % 256);
  return p;
}

TEST(DataImageTest, GreyPngIsExactAndPlanar) {
  const std::vector<uint8_t> grey = Card(1);
  absl::StatusOr<Image> image =
      DecodeImage(EncodePng(grey, 5, 3, 1), "card.png", 1);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->width, 5);
  EXPECT_EQ(image->height, 3);
  EXPECT_EQ(image->channels, 1);
  ASSERT_EQ(image->values.size(), 15u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(image->values[i], grey[i] / 255.0f);
  // Grey asked as RGB: three equal planes.
  image = DecodeImage(EncodePng(grey, 5, 3, 1), "card.png", 3);
  ASSERT_TRUE(image.ok()) << image.status();
  ASSERT_EQ(image->values.size(), 45u);
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 15; ++i)
      EXPECT_EQ(image->values[c * 15 + i], grey[i] / 255.0f);
}

TEST(DataImageTest, RgbPngIsPlanarAndBecomesGreyByLuminance) {
  const std::vector<uint8_t> rgb = Card(3);
  absl::StatusOr<Image> image =
      DecodeImage(EncodePng(rgb, 5, 3, 3), "card.png", 3);
  ASSERT_TRUE(image.ok()) << image.status();
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 15; ++i)
      EXPECT_EQ(image->values[c * 15 + i], rgb[i * 3 + c] / 255.0f);
  // Colours become greys by BT.601 luma on the file's values, as libjpeg
  // and PIL make them (libpng's simplified reading mixed them in linear
  // light: pure red was 126 / 255, not 76).
  const std::vector<uint8_t> colours = {255, 0, 0, 0, 255, 0, 0, 0, 255};
  image = DecodeImage(EncodePng(colours, 3, 1, 3), "rgb.png", 1);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->values, (std::vector<float>{0.299f, 0.587f, 0.114f}));
  image = DecodeImage(EncodePng(rgb, 5, 3, 3), "card.png", 1);
  ASSERT_TRUE(image.ok()) << image.status();
  for (int i = 0; i < 15; ++i) {
    EXPECT_EQ(image->values[i], 0.299f * (rgb[i * 3] / 255.0f) +
                                    0.587f * (rgb[i * 3 + 1] / 255.0f) +
                                    0.114f * (rgb[i * 3 + 2] / 255.0f));
  }
  // An alpha channel is dropped: transparent pixels keep their colour
  // (not blended onto black).
  std::vector<uint8_t> rgba = Card(4);
  for (int i = 0; i < 15; ++i) rgba[i * 4 + 3] = i % 2 ? 0 : 128;
  image = DecodeImage(EncodePng(rgba, 5, 3, 4), "rgba.png", 3);
  ASSERT_TRUE(image.ok()) << image.status();
  ASSERT_EQ(image->values.size(), 45u);
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 15; ++i)
      EXPECT_EQ(image->values[c * 15 + i], rgba[i * 4 + c] / 255.0f);
  std::vector<uint8_t> ga = Card(2);
  for (int i = 0; i < 15; ++i) ga[i * 2 + 1] = 0;
  image = DecodeImage(EncodePng(ga, 5, 3, 2), "ga.png", 1);
  ASSERT_TRUE(image.ok()) << image.status();
  for (int i = 0; i < 15; ++i) EXPECT_EQ(image->values[i], ga[i * 2] / 255.0f);
}

TEST(DataImageTest, SixteenBitPngIsItsValuesOver65535) {
  // libpng's simplified reading took 16-bit samples as linear light (the
  // file's gAMA of 1) and re-encoded them: v * 257 was not v / 255.
  std::vector<uint16_t> deep(15);
  for (int i = 0; i < 15; ++i) deep[i] = static_cast<uint16_t>(i * 17 * 257);
  absl::StatusOr<Image> image =
      DecodeImage(EncodePng16(deep, 5, 3), "deep.png", 1);
  ASSERT_TRUE(image.ok()) << image.status();
  for (int i = 0; i < 15; ++i)
    EXPECT_EQ(image->values[i], static_cast<float>(i * 17) / 255.0f) << i;
}

TEST(DataImageTest, JpegDecodesCloseToItsPixels) {
  // A smooth gradient survives JPEG at quality 100 within a few levels.
  std::vector<uint8_t> grey(16 * 16);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x)
      grey[y * 16 + x] = static_cast<uint8_t>(8 * x + 4 * y);
  absl::StatusOr<Image> image =
      DecodeImage(EncodeJpeg(grey, 16, 16, 1, 100), "ramp.jpg", 1);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->width, 16);
  EXPECT_EQ(image->height, 16);
  for (int i = 0; i < 256; ++i)
    EXPECT_NEAR(image->values[i], grey[i] / 255.0f, 4 / 255.0f) << i;
  std::vector<uint8_t> rgb(16 * 16 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = grey[i / 3];
  image = DecodeImage(EncodeJpeg(rgb, 16, 16, 3, 95), "ramp.jpg", 3);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->values.size(), 768u);
}

TEST(DataImageTest, PgmStillReads) {
  const std::string pgm =
      std::string("P5\n2 1\n255\n") + std::string("\x00\xff", 2);
  absl::StatusOr<Image> image = DecodeImage(pgm, "two.pgm", 1);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->values, (std::vector<float>{0.0f, 1.0f}));
}

TEST(DataImageTest, BadFilesAreRefusedNamingThem) {
  const std::string png = EncodePng(Card(1), 5, 3, 1);
  const std::string jpeg =
      EncodeJpeg(std::vector<uint8_t>(256, 100), 16, 16, 1, 90);
  std::vector<uint8_t> noise(64 * 64);
  for (size_t i = 0; i < noise.size(); ++i)
    noise[i] = static_cast<uint8_t>((i * 2654435761u) >> 24);
  const std::string big = EncodeJpeg(noise, 64, 64, 1, 90);
  struct Case {
    std::string bytes, expect;
  } cases[] = {
      {"GIF89a....", "not a PNG, JPEG or PGM image"},
      {"", "not a PNG, JPEG or PGM image"},
      {png.substr(0, 20), "card.png: not a readable PNG"},
      {png.substr(0, png.size() - 20), "card.png: a damaged PNG"},
      {jpeg.substr(0, 10), "card.png: not a readable JPEG"},
      {big.substr(0, big.size() * 3 / 4), "card.png: a damaged JPEG ("},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Image> image = DecodeImage(c.bytes, "card.png", 1);
    EXPECT_FALSE(image.ok()) << c.expect;
    EXPECT_THAT(image.status().message(), HasSubstr(c.expect));
  }
  // Flipped bytes all through a PNG and a JPEG: an error or an image,
  // never a crash.
  for (const std::string& good : {png, jpeg}) {
    for (size_t at = 0; at < good.size(); at += 3) {
      std::string bad = good;
      bad[at] ^= 0x5a;
      (void)DecodeImage(bad, "flipped", 3);
    }
  }
  EXPECT_THAT(DecodeImage(png, "card.png", 2).status().message(),
              HasSubstr("1 or 3 channels"));
}

TEST(DataImageTest, OversizedImagesAreRefusedBeforeDecoding) {
  // A PNG header that claims 20000 x 2 pixels (its data need not be read).
  const std::string wide =
      EncodePng(std::vector<uint8_t>(20000 * 2), 20000, 2, 1);
  EXPECT_THAT(DecodeImage(wide, "wide.png", 1).status().message(),
              HasSubstr("larger than 16384 on a side"));
  // 4097 x 4097 compresses to little but is over 2^24 pixels.
  const std::string many =
      EncodePng(std::vector<uint8_t>(4097 * 4097), 4097, 4097, 1);
  EXPECT_THAT(DecodeImage(many, "many.png", 1).status().message(),
              HasSubstr("or 16777216 pixels"));
}

TEST(DataImageTest, TheExpectedSizeIsCheckedBeforeThePixels) {
  // A 4000 x 4000 PNG of zeros compresses to a few KB; a model taking 784
  // values refuses it at its header.
  const std::string big =
      EncodePng(std::vector<uint8_t>(4000 * 4000), 4000, 4000, 1);
  EXPECT_LT(big.size(), 100000u);
  const std::string jpeg =
      EncodeJpeg(std::vector<uint8_t>(64 * 64, 7), 64, 64, 1, 90);
  const std::string pgm =
      std::string("P5\n2 1\n255\n") + std::string("\x00\xff", 2);
  for (const std::string& bytes : {big, jpeg, pgm}) {
    EXPECT_THAT(DecodeImage(bytes, "in", 1, 784).status().message(),
                HasSubstr("is not the model's input of 784 values"));
  }
  EXPECT_THAT(DecodeImage(big, "in", 3, 784).status().message(),
              HasSubstr("4000 x 4000 RGB image"));
  EXPECT_TRUE(DecodeImage(jpeg, "in", 1, 64 * 64).ok());
  EXPECT_TRUE(DecodeImage(jpeg, "in", 3, 3 * 64 * 64).ok());
}

TEST(DataImageTest, PathsAreRecognizedByExtension) {
  EXPECT_TRUE(IsImagePath("a.PNG"));
  EXPECT_TRUE(IsImagePath("a.jpeg"));
  EXPECT_TRUE(IsImagePath("x/y.jpg"));
  EXPECT_TRUE(IsImagePath("b.pgm"));
  EXPECT_FALSE(IsImagePath("b.npy"));
}

}  // namespace
}  // namespace gpipe
