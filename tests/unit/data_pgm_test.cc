// PGM images for `gpipectl predict`: binary and text forms, comments,
// 16-bit values, scaling as Fashion-MNIST's pixel / 255; malformed ones
// named.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/pgm.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

TEST(PgmTest, BinaryAndTextFormsScaleByMaxval) {
  const std::string p5 = std::string("P5\n# made by hand\n3 1\n255\n") +
                         std::string("\x00\x33\xff", 3);
  auto a = ParsePgm(p5, "a.pgm");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->width, 3);
  EXPECT_EQ(a->height, 1);
  EXPECT_EQ(a->pixels[1], 51.0f / 255.0f);  // divided, as the dataset does
  EXPECT_EQ(a->pixels[2], 1.0f);
  auto b = ParsePgm("P2 2 2 15\n0 15\n# comment\n 5 10\n", "b.pgm");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->pixels[3], 10.0f / 15.0f);
  auto c = ParsePgm(std::string("P5 1 1 1000\n") + "\x03\xe8", "c.pgm");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pixels[0], 1.0f);  // 16-bit, big-endian
}

TEST(PgmTest, MalformedImagesAreNamed) {
  const auto error = [](const std::string& bytes) {
    return std::string(ParsePgm(bytes, "x.pgm").status().message());
  };
  EXPECT_THAT(error("\x89PNG"), HasSubstr("x.pgm: not a PGM image"));
  EXPECT_THAT(error("P5 3"), HasSubstr("does not give width, height"));
  EXPECT_THAT(error("P5 0 3 255\n"), HasSubstr("empty or too large"));
  EXPECT_THAT(error("P5 2 2 255\n\x01"), HasSubstr("cut short"));
  EXPECT_THAT(error("P2 1 1 9\n10"), HasSubstr("pixel 0 is 10, over maxval 9"));
  EXPECT_THAT(error("P2 2 1 9\n1"), HasSubstr("pixel 1 of 2 is missing"));
  EXPECT_THAT(error("P5 1 1 70000\n"), HasSubstr("maxval 70000"));
  EXPECT_EQ(ReadPgm("/nonexistent.pgm").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace gpipe
