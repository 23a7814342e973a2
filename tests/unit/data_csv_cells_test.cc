// A table's line cut into cells (services/data/csv_cells.h): quoted cells
// as R, spreadsheets and RFC 4180 write them, and the quoting mistakes a
// line can hold, named by their cell.
#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/csv_cells.h"

namespace gpipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Cells(std::string_view line, char delimiter = ',') {
  CsvLineSplitter splitter(delimiter);
  std::vector<std::string_view> cells;
  const absl::Status s = splitter.Split(line, &cells);
  EXPECT_TRUE(s.ok()) << s;
  return std::vector<std::string>(cells.begin(), cells.end());
}

std::string Error(std::string_view line) {
  CsvLineSplitter splitter(',');
  std::vector<std::string_view> cells;
  const absl::Status s = splitter.Split(line, &cells);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  return std::string(s.message());
}

TEST(CsvLineSplitter, PlainCellsAreTrimmed) {
  EXPECT_THAT(Cells(" a , b,c "), ElementsAre("a", "b", "c"));
  EXPECT_THAT(Cells("1,,2,"), ElementsAre("1", "", "2", ""));
  EXPECT_THAT(Cells(""), ElementsAre(""));
  EXPECT_THAT(Cells(" 4\t1.5 \t-2", '\t'), ElementsAre("4", "1.5", "-2"));
}

TEST(CsvLineSplitter, QuotedCellsLoseTheirQuotes) {
  // R's write.csv: every name quoted, numbers not.
  EXPECT_THAT(Cells(R"("","label","x 1")"), ElementsAre("", "label", "x 1"));
  // A delimiter inside quotes is the cell's, spaces around its text are
  // not; "" is one quote.
  EXPECT_THAT(Cells(R"( "a,b" , " c ","say ""hi""",3, " 1.5 ")"),
              ElementsAre("a,b", "c", R"(say "hi")", "3", "1.5"));
  // Each of several escaped cells keeps its own text.
  EXPECT_THAT(Cells(R"("a""","""b","""")"),
              ElementsAre(R"(a")", R"("b)", R"(")"));
  // A quote inside an unquoted cell is kept.
  EXPECT_THAT(Cells(R"(5"6,7)"), ElementsAre(R"(5"6)", "7"));
  EXPECT_THAT(Cells("\"a\"\t\"b\"", '\t'), ElementsAre("a", "b"));
}

TEST(CsvLineSplitter, QuotingMistakesNameTheCell) {
  EXPECT_THAT(Error(R"(1,"open)"),
              HasSubstr("cell 2 opens a quote at byte 3 that the line does "
                        "not close"));
  EXPECT_THAT(Error(R"("ab"c,1)"),
              HasSubstr("cell 1 has text after its closing quote"));
}

}  // namespace
}  // namespace gpipe
