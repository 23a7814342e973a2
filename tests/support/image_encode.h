// PNG and JPEG files made in memory, for the tests and the fuzzer's seeds
// of the image readers (services/data/image_file.h).
#ifndef GPIPE_TESTS_SUPPORT_IMAGE_ENCODE_H_
#define GPIPE_TESTS_SUPPORT_IMAGE_ENCODE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace gpipe::testing_images {

// `pixels`: interleaved 8-bit (row, column, channel), channels 1, 2 (grey
// and alpha), 3 or 4 (RGBA).
std::string EncodePng(const std::vector<uint8_t>& pixels, int width, int height,
                      int channels);
// 16-bit grey, as libpng's simplified writer makes it: the samples as
// given, marked as linear light (a gAMA chunk of 1).
std::string EncodePng16(const std::vector<uint16_t>& grey, int width,
                        int height);
// Channels 1 or 3; quality 1-100.
std::string EncodeJpeg(const std::vector<uint8_t>& pixels, int width,
                       int height, int channels, int quality);

}  // namespace gpipe::testing_images

#endif  // GPIPE_TESTS_SUPPORT_IMAGE_ENCODE_H_
