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

absl::StatusOr<Image> DecodePng(std::string_view bytes, std::string_view what,
                                int channels, int64_t expected) {
  // libpng's simplified API: any bit depth, palette or alpha to 8-bit grey
  // or RGB; errors come back as a message, never as a longjmp out of here.
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(what), ": not a readable PNG (", png.message, ")"));
  }
  const int64_t width = png.width, height = png.height;
  if (absl::Status s = CheckSize(what, width, height, channels, expected);
      !s.ok()) {
    png_image_free(&png);
    return s;
  }
  // Read with an alpha channel and drop it: without one, libpng would
  // blend transparent pixels onto the buffer's zeros (black).
  png.format = channels == 1 ? PNG_FORMAT_GA : PNG_FORMAT_RGBA;
  std::vector<uint8_t> pixels(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, pixels.data(), 0, nullptr)) {
    const std::string message = png.message;
    png_image_free(&png);
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(what), ": a damaged PNG (", message, ")"));
  }
  return FromInterleaved(pixels.data(), width, height, channels, channels + 1);
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
