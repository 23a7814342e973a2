// Grey images in the netpbm PGM format (P5 binary, P2 text), the simplest
// image file every tool writes (`convert x.png x.pgm`, PIL's
// `Image.save("x.pgm")`), for classifying an image with `gpipectl predict`.
#ifndef GPIPE_SERVICES_DATA_PGM_H_
#define GPIPE_SERVICES_DATA_PGM_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace gpipe {

struct GreyImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<float> pixels;  // row-major, each scaled to [0, 1] by maxval
};

// Parses a PGM file's bytes; `what` names them in errors (InvalidArgument:
// not a PGM, a header that does not parse, a size over 16384 x 16384, data
// cut short or a value over maxval).
absl::StatusOr<GreyImage> ParsePgm(std::string_view bytes,
                                   std::string_view what);
absl::StatusOr<GreyImage> ReadPgm(const std::string& path);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_PGM_H_
