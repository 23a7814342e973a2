#include "services/data/pgm.h"

#include <cctype>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/storage/file_io.h"

namespace gpipe {
namespace {

constexpr int64_t kMaxSide = 16384;

// Reads the header's next decimal number, skipping whitespace and
// comments ('#' to the end of the line).
class HeaderReader {
 public:
  explicit HeaderReader(std::string_view bytes) : bytes_(bytes) {}
  bool Next(int64_t* value) {
    while (at_ < bytes_.size()) {
      const char c = bytes_[at_];
      if (c == '#') {
        while (at_ < bytes_.size() && bytes_[at_] != '\n') ++at_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        ++at_;
      } else {
        break;
      }
    }
    int64_t v = 0;
    const size_t begin = at_;
    while (at_ < bytes_.size() &&
           std::isdigit(static_cast<unsigned char>(bytes_[at_]))) {
      v = v * 10 + (bytes_[at_] - '0');
      if (v > (int64_t{1} << 40)) return false;
      ++at_;
    }
    if (at_ == begin) return false;
    *value = v;
    return true;
  }
  size_t at() const { return at_; }
  void Skip(size_t n) { at_ += n; }

 private:
  std::string_view bytes_;
  size_t at_ = 2;  // past the magic
};

}  // namespace

absl::StatusOr<GreyImage> ParsePgm(std::string_view bytes,
                                   std::string_view what) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(AsAbsl(what), ": ", why));
  };
  if (bytes.size() < 2 || bytes[0] != 'P' ||
      (bytes[1] != '5' && bytes[1] != '2')) {
    return bad(
        "not a PGM image (P5 or P2); convert it with `convert IN out.pgm`");
  }
  const bool binary = bytes[1] == '5';
  HeaderReader header(bytes);
  int64_t width = 0, height = 0, maxval = 0;
  if (!header.Next(&width) || !header.Next(&height) || !header.Next(&maxval)) {
    return bad("the header does not give width, height and maxval");
  }
  if (width < 1 || height < 1 || width > kMaxSide || height > kMaxSide) {
    return bad(absl::StrCat("a ", width, " x ", height,
                            " image is empty or too large"));
  }
  if (maxval < 1 || maxval > 65535) {
    return bad(absl::StrCat("maxval ", maxval, " is not in [1, 65535]"));
  }
  GreyImage image{width, height, {}};
  const int64_t n = width * height;
  image.pixels.resize(static_cast<size_t>(n));
  // Divided, not multiplied by 1/maxval: Fashion-MNIST's pixel / 255.
  const float top = static_cast<float>(maxval);
  if (binary) {
    header.Skip(1);  // the single whitespace after maxval
    const int64_t each = maxval < 256 ? 1 : 2;
    const size_t begin = header.at();
    if (begin > bytes.size() ||
        bytes.size() - begin < static_cast<size_t>(n * each)) {
      return bad(
          absl::StrCat("the data is cut short: ", n * each, " bytes expected"));
    }
    for (int64_t i = 0; i < n; ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() +
                                                             begin + i * each);
      const int64_t v = each == 1 ? p[0] : (p[0] << 8) | p[1];  // big-endian
      if (v > maxval) {
        return bad(
            absl::StrCat("pixel ", i, " is ", v, ", over maxval ", maxval));
      }
      image.pixels[i] = static_cast<float>(v) / top;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = 0;
      if (!header.Next(&v)) {
        return bad(absl::StrCat("pixel ", i, " of ", n, " is missing"));
      }
      if (v > maxval) {
        return bad(
            absl::StrCat("pixel ", i, " is ", v, ", over maxval ", maxval));
      }
      image.pixels[i] = static_cast<float>(v) / top;
    }
  }
  return image;
}

absl::StatusOr<GreyImage> ReadPgm(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string bytes, storage::ReadWholeFile(path));
  return ParsePgm(bytes, path);
}

}  // namespace gpipe
