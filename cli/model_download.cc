#include "cli/model_download.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "services/storage/sha256.h"

namespace gpipe::cli {
namespace {

namespace fs = std::filesystem;

bool PlainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// One file being written: NAME.part until it is complete and checked.
class PartFile {
 public:
  PartFile(const fs::path& dir, const gpipe::v1::ModelFileHeader& header)
      : final_(dir / header.name()),
        part_(dir / (header.name() + ".part")),
        expected_(header.bytes()),
        out_(part_, std::ios::binary | std::ios::trunc) {}
  ~PartFile() {
    if (!done_) {
      out_.close();
      std::error_code ec;
      fs::remove(part_, ec);
    }
  }

  absl::Status Write(const std::string& chunk) {
    if (received_ + static_cast<int64_t>(chunk.size()) > expected_) {
      return absl::DataLossError(absl::StrCat(final_.filename().string(),
                                              ": more than the ", expected_,
                                              " bytes its header announced"));
    }
    out_.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    if (!out_) {
      return absl::InternalError(absl::StrCat("cannot write ", part_.string()));
    }
    digest_.Update(chunk);
    received_ += static_cast<int64_t>(chunk.size());
    return absl::OkStatus();
  }

  absl::StatusOr<DownloadedFile> Finish(const std::string& sha256) {
    if (received_ != expected_) {
      return absl::DataLossError(absl::StrCat(final_.filename().string(), ": ",
                                              received_, " of ", expected_,
                                              " bytes arrived"));
    }
    const std::string got = digest_.Finish();
    if (got != sha256) {
      return absl::DataLossError(
          absl::StrCat(final_.filename().string(), ": sha256 ", got,
                       " of the bytes received, the controller's ", sha256));
    }
    out_.close();
    if (!out_) {
      return absl::InternalError(absl::StrCat("cannot write ", part_.string()));
    }
    done_ = true;  // the part file is now the caller's (ReceivedFiles)
    return DownloadedFile{final_.string(), received_, got};
  }

  std::string part() const { return part_.string(); }

 private:
  fs::path final_, part_;
  int64_t expected_;
  int64_t received_ = 0;
  std::ofstream out_;
  storage::Sha256 digest_;
  bool done_ = false;
};

}  // namespace

ReceivedFiles::~ReceivedFiles() {
  std::error_code ec;
  for (const auto& [part, file] : files_) fs::remove(part, ec);
  if (created_dir_.empty()) return;
  // Each only when empty (remove fails on a folder that holds anything).
  for (fs::path d = created_dir_; !d.empty(); d = d.parent_path()) {
    if (!fs::remove(d, ec)) break;
    if (d == fs::path(created_top_)) break;
  }
}

absl::StatusOr<std::vector<DownloadedFile>> ReceivedFiles::Commit() {
  std::vector<DownloadedFile> out;
  while (!files_.empty()) {
    auto [part, file] = std::move(files_.front());
    files_.erase(files_.begin());
    std::error_code ec;
    fs::rename(part, file.path, ec);
    if (ec) {
      fs::remove(part, ec);
      return absl::InternalError(absl::StrCat("cannot rename ", part, " to ",
                                              file.path, ": ", ec.message()));
    }
    out.push_back(std::move(file));
  }
  created_dir_.clear();  // it holds the files now
  return out;
}

absl::StatusOr<ReceivedFiles> ReceiveModelFiles(
    absl::FunctionRef<bool(gpipe::v1::FetchModelResponse*)> read,
    const std::string& dir) {
  std::error_code ec;
  fs::path path = fs::path(dir).lexically_normal();
  if (!path.has_filename() && path.has_parent_path()) {
    path = path.parent_path();  // "out/" is "out"
  }
  // The highest folder of the path that is not there yet (made with the
  // first file, and removed again if the fetch fails), and the nearest one
  // that is, which must be a folder: said before the controller is asked.
  fs::path top, up = path;
  for (; !up.empty() && !fs::exists(up, ec); up = up.parent_path()) {
    top = up;
    if (up == up.parent_path()) break;
  }
  if (!up.empty() && fs::exists(up, ec) && !fs::is_directory(up, ec)) {
    return absl::FailedPreconditionError(
        top.empty()
            ? absl::StrCat(dir, ": is not a directory (the files go into one)")
            : absl::StrCat("cannot create ", dir, ": ", up.string(),
                           " is not a directory"));
  }
  ReceivedFiles done;  // removes its part files on every error return
  bool made = false;   // dir, by the first file
  const auto make_dir = [&]() -> absl::Status {
    if (made) return absl::OkStatus();
    made = true;
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", dir, ": ", ec.message()));
    }
    if (!top.empty()) done.CreatedDirs(path.string(), top.string());
    return absl::OkStatus();
  };
  std::unique_ptr<PartFile> file;
  gpipe::v1::FetchModelResponse m;
  while (read(&m)) {
    switch (m.kind_case()) {
      case gpipe::v1::FetchModelResponse::kHeader:
        if (file != nullptr) {
          return absl::DataLossError(
              "a file began before the previous one was complete");
        }
        if (!PlainName(m.header().name()) || m.header().bytes() < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the controller sent a file named '", m.header().name(), "' of ",
              m.header().bytes(), " bytes: not a plain file name and length"));
        }
        if (absl::Status s = make_dir(); !s.ok()) return s;
        file = std::make_unique<PartFile>(dir, m.header());
        break;
      case gpipe::v1::FetchModelResponse::kChunk:
        if (file == nullptr) {
          return absl::DataLossError("bytes before any file's header");
        }
        if (absl::Status s = file->Write(m.chunk()); !s.ok()) return s;
        break;
      case gpipe::v1::FetchModelResponse::kSha256: {
        if (file == nullptr) {
          return absl::DataLossError("a digest before any file");
        }
        absl::StatusOr<DownloadedFile> f = file->Finish(m.sha256());
        const std::string part = file->part();
        file.reset();
        if (!f.ok()) return f.status();
        done.Add(part, std::move(*f));
        break;
      }
      default:
        return absl::DataLossError("an empty message in the stream");
    }
  }
  if (file != nullptr) {
    return absl::AbortedError("the stream ended inside a file");
  }
  return done;
}

}  // namespace gpipe::cli
