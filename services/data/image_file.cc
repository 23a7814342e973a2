#include "services/data/image_file.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

// clang-format off: jpeglib.h needs stdio's FILE and size_t first.
#include <jpeglib.h>
#include <png.h>
// clang-format on

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/data/pgm.h"
#include "services/storage/file_io.h"

namespace gpipe {
namespace {

// The header's size against the limits and the size the caller expects.
absl::Status CheckSize(std::string_view what, int64_t w, int64_t h,
                       int channels, int64_t expected) {
  if (w > kMaxImageSide || h > kMaxImageSide || w * h > kMaxImagePixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        AsAbsl(what), ": a ", w, " x ", h, " image is larger than ",
        kMaxImageSide, " on a side or ", kMaxImagePixels, " pixels"));
  }
  if (expected > 0 && w * h * channels != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        AsAbsl(what), ": a ", w, " x ", h, channels == 3 ? " RGB" : "",
        " image is not the model's input of ", expected,
        " values (resize it to what the model was trained on)"));
  }
  return absl::OkStatus();
}

// Interleaved 8-bit pixels (row, column, `stride` components of which the
// first `channels` are taken) to planar values / 255.
Image FromInterleaved(const uint8_t* pixels, int64_t width, int64_t height,
                      int64_t channels, int64_t stride) {
  Image image;
  image.width = width;
  image.height = height;
  image.channels = channels;
  const int64_t plane = width * height;
  image.values.resize(static_cast<size_t>(plane * channels));
  for (int64_t i = 0; i < plane; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      image.values[c * plane + i] = pixels[i * stride + c] / 255.0f;
    }
  }
  return image;
}

// libpng's own reading, not its simplified API: that one manages colour
// (a 16-bit file is taken as linear light and an 8-bit one is re-encoded
// by its gAMA chunk, so a pixel of 3 reached the model as 33; colour became
// grey in linear light), where a model takes the values the file holds,
// as the PGM and JPEG readers give them. Errors longjmp back to the
// setjmp in ReadPng with their message; warnings (an odd colour profile,
// which real files often carry) change no pixel and are ignored.
struct PngDecode {
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::string_view bytes;
  size_t read = 0;
  std::jmp_buf jump;
  std::string message;
  std::vector<uint8_t> pixels;  // rows of `stride` samples, 8 or 16 bits
  std::vector<png_bytep> rows;
  int64_t width = 0, height = 0, samples = 0;  // samples a pixel: 1 or 3
  int bits = 8;
  bool stopped = false;  // at the header: the caller checks the size
  ~PngDecode() {
    if (png != nullptr) png_destroy_read_struct(&png, &info, nullptr);
  }
};

void PngFail(png_structp png, png_const_charp message) {
  auto* d = static_cast<PngDecode*>(png_get_error_ptr(png));
  d->message = message;
  std::longjmp(d->jump, 1);
}
void PngQuiet(png_structp, png_const_charp) {}

void PngRead(png_structp png, png_bytep out, size_t size) {
  auto* d = static_cast<PngDecode*>(png_get_io_ptr(png));
  if (d->bytes.size() - d->read < size) png_error(png, "the file is cut short");
  std::memcpy(out, d->bytes.data() + d->read, size);
  d->read += size;
}

// False with d->message set when libpng failed. Nothing in this frame
// needs destroying when an error jumps back to the setjmp.
bool ReadPng(PngDecode* d, int channels, int64_t expected) {
  d->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, d, PngFail, PngQuiet);
  if (d->png == nullptr) {
    d->message = "libpng could not start";
    return false;
  }
  d->info = png_create_info_struct(d->png);
  if (d->info == nullptr) {
    d->message = "libpng could not start";
    return false;
  }
  if (setjmp(d->jump)) return false;
  png_set_read_fn(d->png, d, PngRead);
  png_read_info(d->png, d->info);
  d->width = png_get_image_width(d->png, d->info);
  d->height = png_get_image_height(d->png, d->info);
  if (!CheckSize("", d->width, d->height, channels, expected).ok()) {
    d->stopped = true;
    return true;
  }
  const int type = png_get_color_type(d->png, d->info);
  d->bits = png_get_bit_depth(d->png, d->info) == 16 ? 16 : 8;
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(d->png);
  if (type == PNG_COLOR_TYPE_GRAY && d->bits == 8)
    png_set_expand_gray_1_2_4_to_8(d->png);
  // Alpha is dropped, not blended: a transparent pixel keeps its colour.
  png_set_strip_alpha(d->png);
  png_set_interlace_handling(d->png);
  png_read_update_info(d->png, d->info);
  d->samples = png_get_channels(d->png, d->info);
  const size_t stride = png_get_rowbytes(d->png, d->info);
  d->pixels.resize(stride * static_cast<size_t>(d->height));
  d->rows.resize(static_cast<size_t>(d->height));
  for (int64_t y = 0; y < d->height; ++y)
    d->rows[y] = d->pixels.data() + stride * static_cast<size_t>(y);
  png_read_image(d->png, d->rows.data());
  png_read_end(d->png, nullptr);
  return true;
}

absl::StatusOr<Image> DecodePng(std::string_view bytes, std::string_view what,
                                int channels, int64_t expected) {
  auto d = std::make_unique<PngDecode>();
  d->bytes = bytes;
  if (!ReadPng(d.get(), channels, expected)) {
    return absl::InvalidArgumentError(absl::StrCat(
        AsAbsl(what),
        d->width > 0 ? ": a damaged PNG (" : ": not a readable PNG (",
        d->message, ")"));
  }
  if (d->stopped) {
    return CheckSize(what, d->width, d->height, channels, expected);
  }
  // Each sample / its largest value (255 or 65535): a 16-bit file of v *
  // 257 gives the 8-bit file's v / 255 exactly.
  const float top = d->bits == 16 ? 65535.0f : 255.0f;
  const int64_t plane = d->width * d->height, samples = d->samples;
  const auto sample = [&](int64_t i, int64_t c) {
    const uint8_t* at = d->pixels.data() + (i * samples + c) * (d->bits / 8);
    return (d->bits == 16 ? (at[0] << 8 | at[1]) : at[0]) / top;
  };
  Image image;
  image.width = d->width;
  image.height = d->height;
  image.channels = channels;
  image.values.resize(static_cast<size_t>(plane * channels));
  for (int64_t i = 0; i < plane; ++i) {
    if (samples == channels) {
      for (int64_t c = 0; c < channels; ++c)
        image.values[c * plane + i] = sample(i, c);
    } else if (samples == 1) {  // grey for a colour model: three planes
      for (int64_t c = 0; c < channels; ++c)
        image.values[c * plane + i] = sample(i, 0);
    } else {  // colour for a grey model: ITU-R BT.601 luma, as libjpeg's
      image.values[i] =
          0.299f * sample(i, 0) + 0.587f * sample(i, 1) + 0.114f * sample(i, 2);
    }
  }
  return image;
}

// libjpeg reports errors through error_exit, which must not return: it
// jumps back to Decode's setjmp with the message.
struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void JpegFail(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, errors->message);
  std::longjmp(errors->jump, 1);
}
// Warnings (a file cut short, bytes where a marker belongs) let libjpeg
// go on with made-up pixels; they are counted and the image refused.
void JpegQuiet(j_common_ptr) {}

// What the decode fills, on the heap: nothing that needs destroying lives
// in Decode's frame between its setjmp and a longjmp back to it.
struct JpegDecode {
  jpeg_decompress_struct info;
  JpegErrors errors;
  std::vector<uint8_t> pixels;
  int64_t width = 0, height = 0;
  bool stopped = false;  // at the header: Decode's caller checks the size
  bool damaged = false;  // libjpeg warned: errors.message says what
};

// False with errors.message set when libjpeg failed.
bool Decode(JpegDecode* d, const unsigned char* data, unsigned long size,
            int channels, int64_t expected) {
  d->info.err = jpeg_std_error(&d->errors.manager);
  d->errors.manager.error_exit = JpegFail;
  d->errors.manager.output_message = JpegQuiet;
  if (setjmp(d->errors.jump)) {
    jpeg_destroy_decompress(&d->info);
    return false;
  }
  jpeg_create_decompress(&d->info);
  jpeg_mem_src(&d->info, data, size);
  jpeg_read_header(&d->info, TRUE);
  d->width = d->info.image_width;
  d->height = d->info.image_height;
  if (!CheckSize("", d->width, d->height, channels, expected).ok()) {
    d->stopped = true;
    jpeg_destroy_decompress(&d->info);
    return true;
  }
  d->info.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&d->info);
  const size_t row = static_cast<size_t>(d->width) * channels;
  d->pixels.resize(row * static_cast<size_t>(d->height));
  while (d->info.output_scanline < d->info.output_height) {
    JSAMPROW at = d->pixels.data() + row * d->info.output_scanline;
    jpeg_read_scanlines(&d->info, &at, 1);
  }
  jpeg_finish_decompress(&d->info);
  if (d->errors.manager.num_warnings > 0) {
    d->damaged = true;
    (*d->errors.manager.format_message)(
        reinterpret_cast<j_common_ptr>(&d->info), d->errors.message);
  }
  jpeg_destroy_decompress(&d->info);
  return true;
}

absl::StatusOr<Image> DecodeJpeg(std::string_view bytes, std::string_view what,
                                 int channels, int64_t expected) {
  auto d = std::make_unique<JpegDecode>();
  if (!Decode(d.get(), reinterpret_cast<const unsigned char*>(bytes.data()),
              static_cast<unsigned long>(bytes.size()), channels, expected)) {
    return absl::InvalidArgumentError(absl::StrCat(
        AsAbsl(what), ": not a readable JPEG (", d->errors.message, ")"));
  }
  if (d->stopped) {
    return CheckSize(what, d->width, d->height, channels, expected);
  }
  if (d->damaged) {
    return absl::InvalidArgumentError(absl::StrCat(
        AsAbsl(what), ": a damaged JPEG (", d->errors.message, ")"));
  }
  return FromInterleaved(d->pixels.data(), d->width, d->height, channels,
                         channels);
}

absl::StatusOr<Image> DecodePgm(std::string_view bytes, std::string_view what,
                                int channels, int64_t expected) {
  ASSIGN_OR_RETURN(GreyImage grey, ParsePgm(bytes, what));
  RETURN_IF_ERROR(CheckSize(what, grey.width, grey.height, channels, expected));
  Image image;
  image.width = grey.width;
  image.height = grey.height;
  image.channels = channels;
  image.values.reserve(grey.pixels.size() * channels);
  for (int c = 0; c < channels; ++c) {
    image.values.insert(image.values.end(), grey.pixels.begin(),
                        grey.pixels.end());
  }
  return image;
}

}  // namespace

absl::StatusOr<Image> DecodeImage(std::string_view bytes, std::string_view what,
                                  int channels, int64_t expected_values) {
  if (channels != 1 && channels != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        AsAbsl(what), ": images have 1 or 3 channels, not ", channels));
  }
  if (absl::StartsWith(AsAbsl(bytes), "\x89PNG\r\n\x1a\n")) {
    return DecodePng(bytes, what, channels, expected_values);
  }
  if (absl::StartsWith(AsAbsl(bytes), "\xff\xd8\xff")) {
    return DecodeJpeg(bytes, what, channels, expected_values);
  }
  if (absl::StartsWith(AsAbsl(bytes), "P5") ||
      absl::StartsWith(AsAbsl(bytes), "P2")) {
    return DecodePgm(bytes, what, channels, expected_values);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      AsAbsl(what), ": not a PNG, JPEG or PGM image (by its first bytes)"));
}

absl::StatusOr<Image> ReadImage(const std::string& path, int channels,
                                int64_t expected_values) {
  ASSIGN_OR_RETURN(const std::string bytes, storage::ReadWholeFile(path));
  return DecodeImage(bytes, path, channels, expected_values);
}

bool IsImagePath(std::string_view path) {
  const std::string lower = absl::AsciiStrToLower(AsAbsl(path));
  for (const char* ext : {".png", ".jpg", ".jpeg", ".pgm"}) {
    if (absl::EndsWith(lower, ext)) return true;
  }
  return false;
}

}  // namespace gpipe
