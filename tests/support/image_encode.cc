#include "tests/support/image_encode.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

// clang-format off: jpeglib.h needs stdio's FILE and size_t first.
#include <jpeglib.h>
#include <png.h>
// clang-format on

namespace gpipe::testing_images {

namespace {

// libpng's simplified writer: the size first, then the file.
std::string WritePng(int width, int height, png_uint_32 format,
                     const void* pixels) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = width;
  png.height = height;
  png.format = format;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, pixels, 0, nullptr))
    std::abort();
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&png, out.data(), &size, 0, pixels, 0,
                                 nullptr)) {
    std::abort();
  }
  out.resize(size);
  return out;
}

}  // namespace

std::string EncodePng(const std::vector<uint8_t>& pixels, int width, int height,
                      int channels) {
  return WritePng(width, height,
                  channels == 1   ? PNG_FORMAT_GRAY
                  : channels == 2 ? PNG_FORMAT_GA
                  : channels == 3 ? PNG_FORMAT_RGB
                                  : PNG_FORMAT_RGBA,
                  pixels.data());
}

std::string EncodePng16(const std::vector<uint16_t>& grey, int width,
                        int height) {
  return WritePng(width, height, PNG_FORMAT_LINEAR_Y, grey.data());
}

std::string EncodeJpeg(const std::vector<uint8_t>& pixels, int width,
                       int height, int channels, int quality) {
  jpeg_compress_struct info;
  jpeg_error_mgr errors;
  info.err = jpeg_std_error(&errors);  // test inputs are valid: exit on error
  jpeg_create_compress(&info);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&info, &buffer, &size);
  info.image_width = width;
  info.image_height = height;
  info.input_components = channels;
  info.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels.data()) +
                   info.next_scanline * static_cast<size_t>(width) * channels;
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  std::string out(reinterpret_cast<char*>(buffer), size);
  std::free(buffer);
  return out;
}

}  // namespace gpipe::testing_images
