#include "services/data/csv.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/data/csv_cells.h"
#include "services/storage/file_io.h"
#include "services/storage/safetensors_header.h"
#include "services/tensor/allocator.h"

namespace gpipe {
namespace {

using storage::QuoteForMessage;

// Debian's Abseil has its own string_view, so lines and cells are cut here
// rather than with absl::StrSplit.
std::string_view Trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\r\n\v\f";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(kSpace) - begin + 1);
}

std::vector<std::string_view> SplitOn(std::string_view s, char c) {
  std::vector<std::string_view> parts;
  size_t begin = 0;
  while (true) {
    const size_t end = s.find(c, begin);
    if (end == std::string_view::npos) {
      parts.push_back(s.substr(begin));
      return parts;
    }
    parts.push_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
}

// The columns of the train file, which a test file must repeat.
struct Layout {
  std::vector<std::string> names;  // header names, or "0", "1", ...
  int64_t target = 0;              // index into names
};

// One split's rows as read.
struct Table {
  std::vector<float> features;
  std::vector<int32_t> targets;
};

// Whether all of `s` is a number, parsed as std::from_chars does (the same
// in every locale, unlike strtod) but accepting a leading '+'. *error tells
// a number out of T's range.
template <typename T>
bool ParseWhole(std::string_view s, T* value, std::errc* error) {
  if (s.size() > 1 && s[0] == '+' && s[1] != '-' && s[1] != '+') {
    s.remove_prefix(1);
  }
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *value);
  *error = ec;
  return end == s.data() + s.size() && ec != std::errc::invalid_argument;
}

// Reads the lines of one file by the rules of a CsvFile spec.
class CsvReader {
 public:
  CsvReader(const gpipe::v1::CsvFile& spec, char delimiter)
      : spec_(spec),
        delimiter_(delimiter),
        header_(!spec.has_header() || spec.header()) {}

  // Reads `path` (named `field` in messages). The train file (`layout`
  // null) decides the columns and the target; a test file must match them.
  absl::StatusOr<Table> Read(const std::string& field, const std::string& path,
                             Layout* layout, const Layout* train) {
    field_ = field;
    path_ = path;
    absl::StatusOr<std::string> read = storage::ReadWholeFile(path);
    if (!read.ok()) {
      return absl::Status(read.status().code(),
                          absl::StrCat(field, ": ", read.status().message()));
    }
    std::string_view text = *read;
    // A byte order mark, as spreadsheet programs write, is not a cell.
    if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
    std::vector<std::string_view> lines = SplitOn(text, '\n');
    for (std::string_view& line : lines) {
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    }
    // Blank lines at the end (a final newline, or a few) end the table.
    while (!lines.empty() && Trim(lines.back()).empty()) {
      lines.pop_back();
    }
    if (lines.empty()) return FileError("the file is empty");

    size_t first_row = 0;
    std::vector<std::string_view> cells;
    if (header_) {
      RETURN_IF_ERROR(Split(1, lines[0], &cells));
      first_row = 1;
      if (train != nullptr) {
        std::vector<std::string> names(cells.begin(), cells.end());
        if (names != train->names) {
          return LineError(
              1, absl::StrCat("the columns ", Quoted(names),
                              " differ from those of ", spec_.path(), ": ",
                              Quoted(train->names)));
        }
      } else {
        RETURN_IF_ERROR(LayoutFromHeader(cells, layout));
      }
    } else if (train == nullptr) {
      RETURN_IF_ERROR(Split(1, lines[0], &cells));
      RETURN_IF_ERROR(LayoutFromCount(cells.size(), layout));
    }
    const Layout& columns = train != nullptr ? *train : *layout;
    columns_ = &columns;
    const std::string want_cells =
        header_ ? absl::StrCat("the header has ", columns.names.size())
        : train != nullptr
            ? absl::StrCat("the rows of ", spec_.path(), " have ",
                           columns.names.size())
            : absl::StrCat("the first row has ", columns.names.size());
    if (first_row == lines.size()) return FileError("no data rows");

    Table table;
    const size_t features = columns.names.size() - 1;
    table.features.reserve((lines.size() - first_row) * features);
    for (size_t i = first_row; i < lines.size(); ++i) {
      const int64_t line_no = static_cast<int64_t>(i) + 1;
      if (Trim(lines[i]).empty()) {
        return LineError(line_no, "empty line");
      }
      RETURN_IF_ERROR(Split(line_no, lines[i], &cells));
      if (cells.size() != columns.names.size()) {
        return LineError(line_no,
                         absl::StrCat(cells.size(), " cells, ", want_cells));
      }
      for (size_t c = 0; c < cells.size(); ++c) {
        if (static_cast<int64_t>(c) == columns.target) {
          ASSIGN_OR_RETURN(const int32_t id, Target(line_no, c, cells[c]));
          table.targets.push_back(id);
        } else {
          ASSIGN_OR_RETURN(const float x, Feature(line_no, c, cells[c]));
          table.features.push_back(x);
        }
      }
    }
    return table;
  }

 private:
  // Line `line_no`'s cells (CsvLineSplitter: quoted ones too).
  absl::Status Split(int64_t line_no, std::string_view line,
                     std::vector<std::string_view>* cells) {
    absl::Status s = splitter_.Split(line, cells);
    return s.ok() ? s
                  : LineError(line_no, std::string_view(s.message().data(),
                                                        s.message().size()));
  }

  absl::Status LayoutFromHeader(const std::vector<std::string_view>& cells,
                                Layout* layout) {
    layout->names.assign(cells.begin(), cells.end());
    std::vector<std::string> sorted = layout->names;
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    if (twice != sorted.end()) {
      return LineError(1, absl::StrCat("column ", QuoteForMessage(*twice),
                                       " appears twice"));
    }
    const auto it =
        std::find(layout->names.begin(), layout->names.end(), spec_.target());
    if (it == layout->names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target: no column ", QuoteForMessage(spec_.target()), " in ", path_,
          "; its columns are ", Quoted(layout->names)));
    }
    layout->target = it - layout->names.begin();
    return CheckFeatures(*layout);
  }

  absl::Status LayoutFromCount(size_t count, Layout* layout) {
    int64_t index = 0;
    std::errc error;
    const std::string_view target = spec_.target();
    if (target.empty() || target[0] == '+' ||
        !ParseWhole(target, &index, &error) || error != std::errc()) {
      return absl::InvalidArgumentError(
          absl::StrCat("target: ", QuoteForMessage(target),
                       " is not a column index; without a header the "
                       "target is a zero-based column number such as \"0\""));
    }
    if (index < 0 || index >= static_cast<int64_t>(count)) {
      return absl::InvalidArgumentError(
          absl::StrCat("target: column ", index, " is not among the ", count,
                       " columns of ", path_, " (they are numbered from 0)"));
    }
    for (size_t c = 0; c < count; ++c) {
      layout->names.push_back(absl::StrCat(c));
    }
    layout->target = index;
    return CheckFeatures(*layout);
  }

  absl::Status CheckFeatures(const Layout& layout) {
    if (layout.names.size() < 2) {
      return FileError("no feature columns besides the target");
    }
    return absl::OkStatus();
  }

  std::string Column(size_t c) const {
    return header_
               ? absl::StrCat("column ", QuoteForMessage(columns_->names[c]))
               : absl::StrCat("column ", c);
  }

  absl::StatusOr<float> Feature(int64_t line_no, size_t c,
                                std::string_view cell) {
    if (cell.empty()) return CellError(line_no, c, "empty cell");
    double v = 0;
    std::errc error;
    if (!ParseWhole(cell, &v, &error)) {
      return CellError(line_no, c,
                       absl::StrCat(QuoteForMessage(cell), " is not a number"));
    }
    const float f = static_cast<float>(v);
    if (error != std::errc() || !std::isfinite(f)) {
      return CellError(line_no, c,
                       absl::StrCat(QuoteForMessage(cell),
                                    " is not a finite float32 number"));
    }
    return f;
  }

  absl::StatusOr<int32_t> Target(int64_t line_no, size_t c,
                                 std::string_view cell) {
    if (cell.empty()) return CellError(line_no, c, "empty cell");
    // Integers, and integral floats ("3.0") as pandas writes an int column
    // that once held a NaN.
    double v = 0;
    std::errc error;
    if (!ParseWhole(cell, &v, &error) || error != std::errc() ||
        v != std::trunc(v)) {
      return CellError(
          line_no, c,
          absl::StrCat(QuoteForMessage(cell), " is not an integer class id"));
    }
    if (v < -1) {
      return CellError(line_no, c,
                       absl::StrCat("class id ", QuoteForMessage(cell),
                                    " (ids are >= 0, or -1 for none)"));
    }
    if (v > std::numeric_limits<int32_t>::max()) {
      return CellError(line_no, c,
                       absl::StrCat("class id ", QuoteForMessage(cell),
                                    " does not fit int32"));
    }
    return static_cast<int32_t>(v);
  }

  static std::string Quoted(const std::vector<std::string>& names) {
    std::vector<std::string> quoted;
    for (const std::string& n : names) quoted.push_back(QuoteForMessage(n));
    return absl::StrJoin(quoted, ", ");
  }
  absl::Status FileError(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(field_, ": ", path_, ": ", AsAbsl(what)));
  }
  absl::Status LineError(int64_t line_no, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(field_, ": ", path_, ":", line_no, ": ", AsAbsl(what)));
  }
  absl::Status CellError(int64_t line_no, size_t c,
                         std::string_view what) const {
    return LineError(line_no, absl::StrCat(Column(c), ": ", AsAbsl(what)));
  }

  const gpipe::v1::CsvFile& spec_;
  const char delimiter_;
  CsvLineSplitter splitter_{delimiter_};
  const bool header_;
  std::string field_, path_;
  const Layout* columns_ = nullptr;  // of the file being read
};

}  // namespace

absl::StatusOr<std::unique_ptr<CsvDataset>> CsvDataset::Open(
    const gpipe::v1::CsvFile& spec) {
  const std::string& delimiter =
      spec.delimiter().empty() ? std::string(",") : spec.delimiter();
  if (delimiter.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delimiter: must be one character, got ", QuoteForMessage(delimiter)));
  }
  if (delimiter[0] == '\n' || delimiter[0] == '\r') {
    return absl::InvalidArgumentError("delimiter: must not be a line break");
  }
  const double fraction = spec.test_fraction();
  if (!(fraction >= 0 && fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "test_fraction: must be in [0, 1) (0 means the default 0.1), got ",
        fraction));
  }
  if (spec.path().empty()) return absl::InvalidArgumentError("path: required");
  if (spec.target().empty()) {
    return absl::InvalidArgumentError(
        "target: required (the target column's name, or its zero-based "
        "index when header is false)");
  }

  CsvReader reader(spec, delimiter[0]);
  Layout layout;
  ASSIGN_OR_RETURN(Table train, reader.Read("path", spec.path(), &layout,
                                            /*train=*/nullptr));
  Table test;
  if (!spec.test_path().empty()) {
    ASSIGN_OR_RETURN(
        test, reader.Read("test_path", spec.test_path(), nullptr, &layout));
  } else {
    const double f = fraction == 0 ? kDefaultTestFraction : fraction;
    const int64_t n = static_cast<int64_t>(train.targets.size());
    const int64_t test_n =
        static_cast<int64_t>(std::floor(static_cast<double>(n) * f));
    if (test_n < 1 || test_n >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "path: ", spec.path(), ": ", n, n == 1 ? " row is" : " rows are",
          " too few to split with test_fraction ", f,
          " (each split needs at least one)"));
    }
    const size_t features = layout.names.size() - 1;
    const size_t keep = static_cast<size_t>(n - test_n);
    test.features.assign(train.features.begin() + keep * features,
                         train.features.end());
    test.targets.assign(train.targets.begin() + keep, train.targets.end());
    train.features.resize(keep * features);
    train.targets.resize(keep);
  }

  std::unique_ptr<CsvDataset> d(new CsvDataset());
  for (size_t c = 0; c < layout.names.size(); ++c) {
    if (static_cast<int64_t>(c) != layout.target) {
      d->feature_names_.push_back(layout.names[c]);
    }
  }
  // The recorded columns (a model's, data.csv.feature_columns) in another
  // order, as a re-export or a spreadsheet writes them, are read in the
  // recorded order: found by name, as gpipectl predict finds them. Other
  // columns are left for the caller to refuse.
  if (const auto& want = spec.feature_columns();
      !want.empty() &&
      static_cast<size_t>(want.size()) == d->feature_names_.size()) {
    std::vector<size_t> from;
    for (const std::string& name : want) {
      const auto at =
          std::find(d->feature_names_.begin(), d->feature_names_.end(), name);
      if (at == d->feature_names_.end()) break;
      from.push_back(static_cast<size_t>(at - d->feature_names_.begin()));
    }
    if (from.size() == d->feature_names_.size()) {
      const size_t features = from.size();
      for (Table* t : {&train, &test}) {
        std::vector<float> row(features);
        for (size_t r = 0; r < t->targets.size(); ++r) {
          float* x = t->features.data() + r * features;
          for (size_t c = 0; c < features; ++c) row[c] = x[from[c]];
          std::copy(row.begin(), row.end(), x);
        }
      }
      d->feature_names_.assign(want.begin(), want.end());
    }
  }
  int32_t max_target = 0;
  for (const Table* t : {&train, &test}) {
    for (int32_t id : t->targets) max_target = std::max(max_target, id);
  }
  if (std::all_of(train.targets.begin(), train.targets.end(),
                  [](int32_t t) { return t == -1; })) {
    return absl::InvalidArgumentError(
        absl::StrCat("target: every target of the train split of ", spec.path(),
                     " is -1 (none): nothing to learn"));
  }
  d->num_classes_ = int64_t{max_target} + 1;
  for (auto [part, table] :
       {std::pair{&d->train_, &train}, std::pair{&d->test_, &test}}) {
    part->n = static_cast<int64_t>(table->targets.size());
    part->features = std::move(table->features);
    part->targets = std::move(table->targets);
  }
  return d;
}

int64_t CsvDataset::size(Split split) const { return part(split).n; }

Batch CsvDataset::Gather(Split split,
                         const std::vector<int64_t>& indices) const {
  // Host memory whatever allocator the caller has installed.
  AllocatorScope host(DefaultCpuAllocator());
  const Part& p = part(split);
  const int64_t b = static_cast<int64_t>(indices.size());
  const int64_t f = static_cast<int64_t>(feature_names_.size());
  Tensor inputs = Tensor::Empty(Shape{b, f}, DType::kF32);
  for (int64_t i = 0; i < b; ++i) {
    std::copy_n(p.features.begin() + static_cast<size_t>(indices[i] * f), f,
                inputs.f32() + i * f);
  }
  return Batch{std::move(inputs), GatherTargets(split, indices)};
}

Tensor CsvDataset::GatherTargets(Split split,
                                 const std::vector<int64_t>& indices) const {
  AllocatorScope host(DefaultCpuAllocator());
  const Part& p = part(split);
  const int64_t b = static_cast<int64_t>(indices.size());
  Tensor targets = Tensor::Empty(Shape{b}, DType::kI32);
  for (int64_t i = 0; i < b; ++i) {
    targets.i32()[i] = p.targets[static_cast<size_t>(indices[i])];
  }
  return targets;
}

CsvDataset::Standardization CsvDataset::ComputeStandardization() const {
  const size_t f = feature_names_.size();
  const size_t n = static_cast<size_t>(train_.n);
  std::vector<double> sum(f, 0.0), squares(f, 0.0);
  for (size_t r = 0; r < n; ++r) {
    for (size_t c = 0; c < f; ++c) sum[c] += train_.features[r * f + c];
  }
  for (size_t c = 0; c < f; ++c) sum[c] /= static_cast<double>(n);
  // Two passes: squared deviations from the mean lose less than the mean
  // of squares minus the squared mean.
  for (size_t r = 0; r < n; ++r) {
    for (size_t c = 0; c < f; ++c) {
      const double d = train_.features[r * f + c] - sum[c];
      squares[c] += d * d;
    }
  }
  Standardization s;
  for (size_t c = 0; c < f; ++c) {
    const float sd =
        static_cast<float>(std::sqrt(squares[c] / static_cast<double>(n)));
    s.mean.push_back(static_cast<float>(sum[c]));
    // Dividing by a std below float's smallest normal would overflow; such
    // a feature is constant for every purpose here.
    s.std.push_back(sd < std::numeric_limits<float>::min() ? 1.0f : sd);
  }
  return s;
}

}  // namespace gpipe
