// Tables of numbers (data.csv): columns by header name or index, the test
// split from a file or a fraction, the standardization statistics, and
// malformed files refused naming the line, the column and the cell.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/csv.h"
#include "services/data/dataset.h"

namespace gpipe {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::HasSubstr;

class CsvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("csv_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  // A spec for `content` with target column "label".
  gpipe::v1::CsvFile Spec(const std::string& content) {
    gpipe::v1::CsvFile spec;
    spec.set_path(Write("t.csv", content));
    spec.set_target("label");
    return spec;
  }
  // Opening `spec` must fail with InvalidArgument; returns the message.
  static std::string Error(const gpipe::v1::CsvFile& spec) {
    auto d = CsvDataset::Open(spec);
    EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
    return std::string(d.status().message());
  }
  std::filesystem::path dir_;
};

// Ten rows: a = row, label = row % 3, b = 10 * row.
std::string TenRows() {
  std::string s = "a,label,b\n";
  for (int r = 0; r < 10; ++r) {
    s += std::to_string(r) + "," + std::to_string(r % 3) + "," +
         std::to_string(10 * r) + "\n";
  }
  return s;
}

TEST_F(CsvTest, ColumnsByHeaderAndAFractionForTest) {
  gpipe::v1::CsvFile spec = Spec(TenRows());
  spec.set_test_fraction(0.2);
  auto d = CsvDataset::Open(spec);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(Split::kTrain), 8);
  EXPECT_EQ((*d)->size(Split::kTest), 2);
  EXPECT_THAT((*d)->feature_names(), ElementsAre("a", "b"));
  EXPECT_EQ((*d)->input_shape(), (Shape{2}));
  EXPECT_EQ((*d)->input_dtype(), DType::kF32);
  EXPECT_EQ((*d)->target_shape(), Shape{});
  EXPECT_EQ((*d)->num_classes(), 3);
  const Batch b = (*d)->Gather(Split::kTrain, {7, 1});
  EXPECT_EQ(b.inputs.shape(), (Shape{2, 2}));
  EXPECT_THAT(b.inputs.ToVector(), ElementsAre(7, 70, 1, 10));
  EXPECT_EQ(b.targets.shape(), (Shape{2}));
  EXPECT_EQ(b.targets.i32()[0], 1);
  EXPECT_EQ(b.targets.i32()[1], 1);
  const Batch t = (*d)->Gather(Split::kTest, {1});
  EXPECT_THAT(t.inputs.ToVector(), ElementsAre(9, 90));
  EXPECT_EQ((*d)->GatherTargets(Split::kTest, {0}).i32()[0], 2);

  spec.set_test_fraction(0);  // 0.1: one test row
  EXPECT_EQ((*CsvDataset::Open(spec))->size(Split::kTest), 1);
}

TEST_F(CsvTest, NoHeaderDelimiterWhitespaceAndLineEndings) {
  gpipe::v1::CsvFile spec;
  // A byte order mark, CRLF, spaces around cells, tabs, a trailing blank
  // line; the target is column 0.
  spec.set_path(Write("t.tsv",
                      "\xEF\xBB\xBF 4\t1.5\t-2e1 \r\n"
                      "-1\t +3\t0.25\r\n"
                      "0\t2\t3\r\n"
                      "\r\n"));
  spec.set_header(false);
  spec.set_target("0");
  spec.set_delimiter("\t");
  spec.set_test_path(Write("v.tsv", "7\t1\t1\n"));
  auto d = CsvDataset::Open(spec);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(Split::kTrain), 3);
  EXPECT_EQ((*d)->size(Split::kTest), 1);
  EXPECT_THAT((*d)->feature_names(), ElementsAre("1", "2"));
  EXPECT_EQ((*d)->num_classes(), 8);  // the test file's 7
  const Batch b = (*d)->Gather(Split::kTrain, {0, 1});
  EXPECT_THAT(b.inputs.ToVector(), ElementsAre(1.5f, -20, 3, 0.25f));
  EXPECT_EQ(b.targets.i32()[0], 4);
  EXPECT_EQ(b.targets.i32()[1], -1);

  // The test file must have as many columns.
  spec.set_test_path(Write("w.tsv", "7\t1\n"));
  const std::string cells = Error(spec);
  EXPECT_THAT(cells,
              HasSubstr("test_path: " + spec.test_path() + ":1: 2 cells"));
  // A name is not an index without a header.
  spec.set_target("label");
  EXPECT_THAT(Error(spec),
              HasSubstr("target: \"label\" is not a column index"));
  spec.set_target("3");
  EXPECT_THAT(Error(spec), HasSubstr("target: column 3 is not among the 3"));
}

// A table as R's write.csv writes it: the names quoted (and a first,
// unnamed column of row names, here numbers), the numbers not; a name
// holding the delimiter, quoted.
TEST_F(CsvTest, QuotedNamesAndCells) {
  gpipe::v1::CsvFile spec = Spec(
      "\"\",\"a,1\",\"label\",\"b\"\n"
      "\"1\",0.5,\"2\",3\n"
      "\"2\",-1,0,\"4e1\"\n");
  spec.set_test_fraction(0.5);
  auto d = CsvDataset::Open(spec);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT((*d)->feature_names(), ElementsAre("", "a,1", "b"));
  const Batch b = (*d)->Gather(Split::kTrain, {0});
  EXPECT_THAT(b.inputs.ToVector(), ElementsAre(1, 0.5, 3));
  EXPECT_EQ(b.targets.i32()[0], 2);
  // A quote the line does not close is refused naming the line.
  EXPECT_THAT(Error(Spec("a,label\n1,\"2\n")),
              HasSubstr("t.csv:2: cell 2 opens a quote"));
}

// A table of the recorded feature columns in another order (a model's
// data.csv.feature_columns, read later from a re-exported file) is read in
// the recorded order, found by name; other columns are not reordered.
TEST_F(CsvTest, RecordedColumnsInAnotherOrderAreFoundByName) {
  gpipe::v1::CsvFile spec = Spec(TenRows());  // a, label, b
  spec.add_feature_columns("b");
  spec.add_feature_columns("a");
  auto d = CsvDataset::Open(spec);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT((*d)->feature_names(), ElementsAre("b", "a"));
  EXPECT_THAT((*d)->Gather(Split::kTrain, {7}).inputs.ToVector(),
              ElementsAre(70, 7));
  EXPECT_THAT((*d)->Gather(Split::kTest, {0}).inputs.ToVector(),
              ElementsAre(90, 9));
  spec.set_feature_columns(1, "c");  // not the file's: left as the file has
  d = CsvDataset::Open(spec);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT((*d)->feature_names(), ElementsAre("a", "b"));
}

TEST_F(CsvTest, TestFileWithTheSameHeader) {
  gpipe::v1::CsvFile spec = Spec(TenRows());
  spec.set_test_path(Write("test.csv", "a,label,b\n1,5,2\n"));
  auto d = CsvDataset::Open(spec);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(Split::kTrain), 10);
  EXPECT_EQ((*d)->size(Split::kTest), 1);
  EXPECT_EQ((*d)->num_classes(), 6);

  spec.set_test_path(Write("other.csv", "a,label,c\n1,5,2\n"));
  const std::string header = Error(spec);
  EXPECT_THAT(header, HasSubstr("test_path: " + spec.test_path() + ":1: "));
  EXPECT_THAT(header, HasSubstr("\"a\", \"label\", \"c\" differ"));
  spec.set_test_path((dir_ / "missing.csv").string());
  auto missing = CsvDataset::Open(spec);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("test_path: "));
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.csv"));
}

TEST_F(CsvTest, StandardizationOverTheTrainSplit) {
  // Train rows 1..4 (x) and a constant; the test row must not count.
  gpipe::v1::CsvFile spec =
      Spec("x,c,label\n1,5,0\n2,5,1\n3,5,0\n4,5,1\n1000,-7,0\n");
  spec.set_test_fraction(0.2);
  auto d = CsvDataset::Open(spec);
  ASSERT_TRUE(d.ok()) << d.status();
  const CsvDataset::Standardization s = (*d)->ComputeStandardization();
  EXPECT_THAT(s.mean, ElementsAre(FloatEq(2.5f), FloatEq(5)));
  EXPECT_THAT(s.std, ElementsAre(FloatEq(std::sqrt(1.25f)), FloatEq(1)));
  // The dataset itself is not normalized.
  EXPECT_EQ((*d)->Gather(Split::kTest, {0}).inputs.f32()[0], 1000);
}

TEST_F(CsvTest, BadCellsNameTheLineAndColumn) {
  const std::string path = (dir_ / "t.csv").string();
  EXPECT_THAT(Error(Spec("a,b,label\n1,2,0\n3,4\n")),
              HasSubstr("path: " + path + ":3: 2 cells, the header has 3"));
  EXPECT_THAT(
      Error(Spec("a,b,label\n1,2,0\n1,2,0\n1,2,0\n1,abc,0\n")),
      HasSubstr("path: " + path + ":5: column \"b\": \"abc\" is not a number"));
  EXPECT_THAT(Error(Spec("a,b,label\r\n1,nan,0\r\n")),
              HasSubstr(":2: column \"b\": \"nan\" is not a finite"));
  EXPECT_THAT(Error(Spec("a,b,label\n1,1e39,0\n")),
              HasSubstr("\"1e39\" is not a finite float32 number"));
  EXPECT_THAT(Error(Spec("a,b,label\n1, ,0\n")),
              HasSubstr(":2: column \"b\": empty cell"));
  EXPECT_THAT(Error(Spec("a,b,label\n1,2,-3\n")),
              HasSubstr(":2: column \"label\": class id \"-3\" (ids are >= 0, "
                        "or -1 for none)"));
  EXPECT_THAT(Error(Spec("a,b,label\n1,2,2.5\n")),
              HasSubstr("\"2.5\" is not an integer class id"));
  EXPECT_THAT(Error(Spec("a,b,label\n1,2,3e10\n")),
              HasSubstr("does not fit int32"));
  EXPECT_THAT(Error(Spec("a,b,label\n1,2,0\n\n1,2,0\n")),
              HasSubstr(":3: empty line"));
  EXPECT_THAT(Error(Spec("a,a,label\n1,2,0\n")),
              HasSubstr(":1: column \"a\" appears twice"));
}

TEST_F(CsvTest, BadFilesAndSpecs) {
  const std::string missing_target = Error(Spec("a,b,class\n1,2,0\n"));
  EXPECT_THAT(missing_target, HasSubstr("target: no column \"label\""));
  EXPECT_THAT(missing_target, HasSubstr("\"a\", \"b\", \"class\""));
  // A binary file's bytes are shown escaped, a UTF-8 name as it is: raw
  // bytes that are no UTF-8 reached the terminal.
  const std::string binary = Error(Spec("\xff\xfe\x80x,\xc3\xa9t\xc3\n1,2\n"));
  EXPECT_THAT(binary, HasSubstr("\"\\xff\\xfe\\x80x\", \"\xc3\xa9t\\xc3\""));
  EXPECT_THAT(Error(Spec("")), HasSubstr("t.csv: the file is empty"));
  EXPECT_THAT(Error(Spec("\n\n")), HasSubstr("the file is empty"));
  EXPECT_THAT(Error(Spec("a,b,label\n")), HasSubstr("t.csv: no data rows"));
  EXPECT_THAT(Error(Spec("label\n1\n2\n")),
              HasSubstr("no feature columns besides the target"));
  EXPECT_THAT(Error(Spec("a,label\n1,0\n2,0\n")),
              HasSubstr("2 rows are too few to split with test_fraction 0.1"));

  gpipe::v1::CsvFile spec = Spec(TenRows());
  spec.set_delimiter(";;");
  EXPECT_THAT(Error(spec),
              HasSubstr("delimiter: must be one character, got \";;\""));
  spec.set_delimiter("\n");
  EXPECT_THAT(Error(spec), HasSubstr("delimiter: must not be a line break"));
  spec.set_delimiter(";");  // the file is comma-separated
  EXPECT_THAT(Error(spec), HasSubstr("target: no column \"label\""));
  spec.clear_delimiter();
  spec.set_test_fraction(-0.5);
  EXPECT_THAT(
      Error(spec),
      HasSubstr("test_fraction: must be in [0, 1) (0 means the default 0.1)"));
  spec.set_test_fraction(0);
  spec.clear_target();
  EXPECT_THAT(Error(spec), HasSubstr("target: required"));

  spec = Spec(TenRows());
  spec.set_path((dir_ / "missing.csv").string());
  auto missing = CsvDataset::Open(spec);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("path: "));
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.csv"));
}

// Through the job's data spec an error names the field as the spec's own
// checks do ("data.csv.path: FILE:5: ..."), not "data.csv: path: ...".
TEST_F(CsvTest, ErrorsNameTheSpecField) {
  gpipe::v1::DataSpec spec;
  *spec.mutable_csv() = Spec("a,b,label\n1,2,0\n1,2,0\n1,2,0\n1,abc,0\n");
  const std::string path = (dir_ / "t.csv").string();
  auto d = OpenDataset(spec, Shape{2}, 1);
  EXPECT_THAT(d.status().message(),
              HasSubstr("data.csv.path: " + path + ":5: column \"b\""));
  spec.mutable_csv()->set_path((dir_ / "missing.csv").string());
  d = OpenDataset(spec, Shape{2}, 1);
  EXPECT_THAT(d.status().message(), HasSubstr("data.csv.path: "));
  // A file named like a field is a file: "data.text.path: shouting: ...",
  // not "data.text.path.shouting: ...".
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir_);
  std::ofstream("shouting") << "abcabcabcabcT";
  gpipe::v1::DataSpec text;
  text.mutable_text()->set_path("shouting");
  text.mutable_text()->set_seq_len(4);
  text.mutable_text()->set_vocabulary("abc");
  d = OpenDataset(text, Shape{4}, 1, DType::kI32);
  std::filesystem::current_path(cwd);
  EXPECT_THAT(d.status().message(), HasSubstr("data.text.path: shouting: "));
}

// A model input the feature columns do not fill is refused when the data
// is opened, naming the columns, with standardization or without: a
// smaller one made each sample's gather write past the batch (a crashed
// worker), a larger one read past it.
TEST_F(CsvTest, AModelInputTheColumnsDoNotFillIsRefused) {
  gpipe::v1::DataSpec spec;
  *spec.mutable_csv() = Spec(TenRows());
  spec.mutable_csv()->set_test_fraction(0.2);
  ASSERT_TRUE(OpenDataset(spec, Shape{2}, 1).ok());
  for (bool standardize : {false, true}) {
    spec.mutable_csv()->set_standardize(standardize);
    for (const Shape& input : {Shape{1}, Shape{3}, Shape{400}, Shape{1, 3}}) {
      auto d = OpenDataset(spec, input, 1);
      EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
      EXPECT_THAT(d.status().message(),
                  HasSubstr("has 2 feature columns (a, b), but the model "
                            "input " +
                            input.ToString()));
    }
  }
}

}  // namespace
}  // namespace gpipe
