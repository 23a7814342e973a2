#include "services/data/csv_cells.h"

#include "absl/strings/str_cat.h"

namespace gpipe {
namespace {

// Space around a cell, not the delimiter itself (a tab-separated table's
// cells end at tabs).
bool IsSpace(char c, char delimiter) {
  return c != delimiter &&
         (c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f');
}

std::string_view Trim(std::string_view s, char delimiter) {
  size_t begin = 0, end = s.size();
  while (begin < end && IsSpace(s[begin], delimiter)) ++begin;
  while (end > begin && IsSpace(s[end - 1], delimiter)) --end;
  return s.substr(begin, end - begin);
}

}  // namespace

absl::Status CsvLineSplitter::Split(std::string_view line,
                                    std::vector<std::string_view>* cells) {
  cells->clear();
  unescaped_.clear();
  size_t p = 0;
  while (true) {
    const size_t start = p;
    while (p < line.size() && IsSpace(line[p], delimiter_)) ++p;
    if (p < line.size() && line[p] == '"') {
      const size_t open = p++;
      bool escaped = false;
      while (true) {
        const size_t quote = line.find('"', p);
        if (quote == std::string_view::npos) {
          return absl::InvalidArgumentError(absl::StrCat(
              "cell ", cells->size() + 1, " opens a quote at byte ", open + 1,
              " that the line does not close (a line break inside quotes is "
              "not read)"));
        }
        if (quote + 1 < line.size() && line[quote + 1] == '"') {
          escaped = true;
          p = quote + 2;
          continue;
        }
        // Trimmed as an unquoted cell is: training parses numbers without
        // spaces and predict strips them, so " 1.5" and "label " would
        // read differently in the two.
        std::string_view inside =
            Trim(line.substr(open + 1, quote - open - 1), delimiter_);
        if (escaped) {
          std::string& text = unescaped_.emplace_back();
          for (size_t i = 0; i < inside.size(); ++i) {
            text.push_back(inside[i]);
            if (inside[i] == '"') ++i;  // the second of a ""
          }
          inside = text;
        }
        cells->push_back(inside);
        p = quote + 1;
        break;
      }
      while (p < line.size() && IsSpace(line[p], delimiter_)) ++p;
      if (p < line.size() && line[p] != delimiter_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cell ", cells->size(),
            " has text after its closing "
            "quote (a quote inside a quoted cell is written \"\")"));
      }
    } else {
      const size_t end = line.find(delimiter_, start);
      const size_t stop = end == std::string_view::npos ? line.size() : end;
      cells->push_back(Trim(line.substr(start, stop - start), delimiter_));
      p = stop;
    }
    if (p >= line.size()) return absl::OkStatus();
    ++p;  // the delimiter
  }
}

}  // namespace gpipe
