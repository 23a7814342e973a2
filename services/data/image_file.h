// Image files for `gpipectl predict`: PNG (libpng), JPEG (libjpeg-turbo)
// and PGM, told apart by their first bytes, decoded to the channels the
// model takes. A library of its own (gpipe_image), so that only what
// reads images links the codecs.
#ifndef GPIPE_SERVICES_DATA_IMAGE_FILE_H_
#define GPIPE_SERVICES_DATA_IMAGE_FILE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace gpipe {

struct Image {
  int64_t width = 0;
  int64_t height = 0;
  int64_t channels = 0;  // 1 (grey) or 3 (RGB)
  // Planar (channel, row, column), each 8-bit value / 255, as the training
  // data's bytes were scaled.
  std::vector<float> values;
};

// The largest side accepted (as for PGM), and the most pixels (4096 x 4096):
// an image past either is refused at its header, before anything is
// allocated for its pixels.
inline constexpr int64_t kMaxImageSide = 16384;
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 24;

// Decodes a PNG, JPEG or PGM file's bytes into `channels` (1 or 3):
// the file's values over their largest (no gamma or colour profile
// applied), colour becoming grey by ITU-R BT.601 luma (0.299 R + 0.587 G +
// 0.114 B), grey repeated for RGB, an
// alpha channel is dropped. `what` names the bytes in errors
// (InvalidArgument: another format, a damaged or truncated file, a side
// over kMaxImageSide, a colour space the codec cannot convert). With
// `expected_values` (not 0), an image whose width x height x channels
// differs is refused once its header is read, before its pixels are
// decoded: a small compressed file cannot make the reader allocate what
// the model would never take.
absl::StatusOr<Image> DecodeImage(std::string_view bytes, std::string_view what,
                                  int channels, int64_t expected_values = 0);
absl::StatusOr<Image> ReadImage(const std::string& path, int channels,
                                int64_t expected_values = 0);

// Whether a path names a file DecodeImage reads (by its extension).
bool IsImagePath(std::string_view path);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_IMAGE_FILE_H_
