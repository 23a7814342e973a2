// One line of a table cut into its cells, quoted cells included: R's
// write.csv quotes every name ("label"), spreadsheets quote a cell that
// holds the delimiter, and a reader that split at every delimiter kept the
// quotes in the names (no column "label") or cut such a cell in two.
#ifndef GPIPE_SERVICES_DATA_CSV_CELLS_H_
#define GPIPE_SERVICES_DATA_CSV_CELLS_H_

#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace gpipe {

// Cells as RFC 4180 writes them: a cell in double quotes may hold the
// delimiter, and "" inside it stands for one ". Spaces and tabs around a
// cell's text are not part of it, inside quotes or out (a table of numbers
// and names has no use for them). A quote inside an unquoted cell is kept
// as it is. A line break inside quotes is not read:
// lines are cut first, and such a cell is refused as not closed.
class CsvLineSplitter {
 public:
  explicit CsvLineSplitter(char delimiter) : delimiter_(delimiter) {}

  // The cells of `line` (without its line break) into `cells`, valid until
  // the next call and while `line`'s text lives. InvalidArgument names the
  // cell (from 1) for an unclosed quote or text after a closing one.
  absl::Status Split(std::string_view line,
                     std::vector<std::string_view>* cells);

 private:
  char delimiter_;
  // Quoted cells with "" in them, unescaped: a deque keeps each one where
  // it is while more are added.
  std::deque<std::string> unescaped_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_CSV_CELLS_H_
