// Stage checkpoint throughput against the disk's plain speed, in one run:
// for each size (MB of parameters + AdamW state), a one-stage model of that
// size is saved with SaveStageCheckpoint (safetensors, temp file, fsync,
// rename, sha256 of the file) and restored with RestoreStageCheckpoint (sha256
// check against the manifest, read, copy into the stage): the shared-path
// transport; then saved and restored through a controller on loopback
// (the controller transport: ControllerFileStore's upload, the controller's
// write + fsync + rename, its commit, and the fetch back into the stage,
// checkpoint_transport.h); and the same byte count is written (write +
// fsync) and read back plainly in the same directory. Before every read the
// file's pages are dropped from the page cache (posix_fadvise DONTNEED after
// fsync), so reads come from the disk.
//   checkpoint_bench [--sizes 8,64,256] [--rounds 3] [--dir DIR]
//                    [--glibc-malloc]
// DIR defaults to a fresh directory next to the binary (under build/), and
// is removed at the end. Memory as in gpipe-worker (KeepFreedMemory), or
// glibc's defaults with --glibc-malloc.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/args.h"
#include "bench/checkpoint_transport.h"
#include "bench/timing.h"
#include "services/core/memory.h"
#include "services/core/status.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/stage.h"
#include "services/pipeline/stage_checkpoint.h"
#include "services/storage/file_io.h"
#include "services/storage/manifest.h"
#include "services/storage/safetensors.h"
#include "services/storage/sha256.h"

namespace gpipe::bench {
namespace {

namespace v1 = gpipe::v1;
namespace fs = std::filesystem;

constexpr size_t kChunk = 4 << 20;  // plain I/O in 4 MiB calls
constexpr int64_t kInputs = 1024;
constexpr int64_t kClasses = 10;

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Removes the bench's directory however the run ends.
class ScopedDir {
 public:
  explicit ScopedDir(fs::path path) : path_(std::move(path)) {}
  ~ScopedDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScopedDir(const ScopedDir&) = delete;
  ScopedDir& operator=(const ScopedDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Linear(1024 -> hidden), ReLU, Linear(hidden -> 10) with AdamW: parameters,
// exp_avg and exp_avg_sq make 12 bytes per parameter, so `hidden` is chosen
// to make about `megabytes` of checkpoint.
absl::StatusOr<v1::JobSpec> SpecOfSize(int64_t megabytes) {
  const int64_t params = megabytes * 1000 * 1000 / 12;
  const int64_t hidden =
      std::max<int64_t>(1, params / (kInputs + 1 + kClasses + 1));
  const std::string json = absl::StrCat(
      R"({"name": "checkpoint-bench",
  "model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [)",
      kInputs, R"(]}},
    "layers": [{"linear": {"inFeatures": )",
      kInputs, R"(, "outFeatures": )", hidden, R"(}}, {"relu": {}},
               {"linear": {"inFeatures": )",
      hidden, R"(, "outFeatures": )", kClasses, R"(}}],
    "loss": {"softmaxCrossEntropy": {}}},
  "optimizer": {"lr": 0.001, "adamw": {}},
  "data": {"synthetic": {"task": "CLASSES", "features": )",
      kInputs, R"(, "classes": )", kClasses,
      R"(, "trainSamples": 16, "testSamples": 16}},
  "checkpoint": {"every": 1, "keep": 2},
  "batchSize": 8, "steps": 100, "seed": 1})");
  return ParseJobSpecJson(json);
}

// Drops a file's pages from the page cache (after fsync they are clean), so
// that the next read of it goes to the disk.
absl::Status DropCache(const std::string& path) {
  storage::ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Errno("cannot open", path);
  if (::fdatasync(fd.get()) != 0) return Errno("fdatasync", path);
  const int rc = ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  if (rc != 0) {
    errno = rc;
    return Errno("posix_fadvise", path);
  }
  return absl::OkStatus();
}

absl::Status PlainWrite(const std::string& path, const std::vector<char>& buf,
                        int64_t bytes) {
  storage::ScopedFd fd(
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Errno("cannot create", path);
  for (int64_t done = 0; done < bytes;) {
    const size_t n = std::min<int64_t>(buf.size(), bytes - done);
    const ssize_t w = ::write(fd.get(), buf.data(), n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    done += w;
  }
  if (::fsync(fd.get()) != 0) return Errno("fsync", path);
  return fd.Close();
}

absl::Status PlainRead(const std::string& path, std::vector<char>& buf) {
  storage::ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Errno("cannot open", path);
  for (;;) {
    const ssize_t r = ::read(fd.get(), buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("read", path);
    }
    if (r == 0) return absl::OkStatus();
  }
}

absl::Status PlainReadInto(const std::string& path, char* dst, int64_t bytes) {
  storage::ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Errno("cannot open", path);
  for (int64_t done = 0; done < bytes;) {
    const ssize_t r = ::read(fd.get(), dst + done, bytes - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("read", path);
    }
    if (r == 0) return absl::DataLossError(absl::StrCat(path, " is short"));
    done += r;
  }
  return absl::OkStatus();
}

struct Row {
  int64_t bytes = 0;
  std::vector<double> save, restore, write, read;  // seconds per round
  // Parts of a restore, each from a cold page cache: the sha256 check alone
  // and the safetensors read alone.
  std::vector<double> sha256, parse;
  // The plain read again, into fresh memory of the file's size (as a
  // restore reads into newly allocated tensors): its page faults included.
  std::vector<double> read_fresh;
  // Through the controller: the upload (until the controller has the file
  // fsynced under its name) and the fetch from a cold page cache.
  std::vector<double> upload, fetch;
};

absl::StatusOr<Row> MeasureSize(int64_t megabytes, int rounds,
                                const fs::path& dir) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, SpecOfSize(megabytes));
  ASSIGN_OR_RETURN(std::unique_ptr<Dataset> data, OpenJobDataset(spec));
  std::shared_ptr<const Dataset> dataset = std::move(data);
  StagePlacement placement;
  placement.layer_end = spec.model().layers_size();
  ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage,
                   Stage::Create(spec, placement, dataset, nullptr, nullptr));
  const fs::path ckpt_dir = dir / absl::StrCat("ckpt-", megabytes);
  const std::string file = (ckpt_dir / "stage-0.safetensors").string();
  const std::string manifest_path =
      (ckpt_dir / storage::kManifestName).string();
  const std::string plain = (dir / absl::StrCat("plain-", megabytes)).string();
  std::vector<char> buf(kChunk, '\x5a');
  ASSIGN_OR_RETURN(std::unique_ptr<ControllerTransportRig> rig,
                   ControllerTransportRig::Start(
                       dir / absl::StrCat("controller-", megabytes), spec));
  Row row;
  for (int r = 0; r < rounds; ++r) {
    const int64_t uploaded_step = r + 1;
    absl::StatusOr<StageFileStore::Stored> uploaded;
    row.upload.push_back(
        TimeSeconds([&] { uploaded = rig->Upload(*stage, uploaded_step); }));
    RETURN_IF_ERROR(uploaded.status());
    RETURN_IF_ERROR(rig->Commit(uploaded_step, *uploaded));
    RETURN_IF_ERROR(DropCache(uploaded->path));
    absl::StatusOr<int64_t> fetched;
    row.fetch.push_back(
        TimeSeconds([&] { fetched = rig->Fetch(*stage, uploaded_step); }));
    RETURN_IF_ERROR(fetched.status());

    absl::StatusOr<WrittenCheckpoint> written;
    row.save.push_back(
        TimeSeconds([&] { written = SaveStageCheckpoint(*stage, 1, file); }));
    RETURN_IF_ERROR(written.status());
    row.bytes = written->bytes;
    v1::CheckpointManifest manifest;
    manifest.set_step(1);
    v1::CheckpointFile* f = manifest.add_files();
    f->set_path(fs::path(file).filename().string());
    f->set_sha256(written->sha256);
    f->set_bytes(written->bytes);
    f->set_layer_begin(placement.layer_begin);
    f->set_layer_end(placement.layer_end);
    RETURN_IF_ERROR(storage::WriteManifest(manifest_path, manifest));
    RETURN_IF_ERROR(DropCache(file));
    absl::StatusOr<int64_t> step;
    row.restore.push_back(TimeSeconds(
        [&] { step = RestoreStageCheckpoint(*stage, manifest_path); }));
    RETURN_IF_ERROR(step.status());
    RETURN_IF_ERROR(DropCache(file));
    absl::StatusOr<std::string> sha;
    row.sha256.push_back(TimeSeconds([&] { sha = storage::Sha256File(file); }));
    RETURN_IF_ERROR(sha.status());
    RETURN_IF_ERROR(DropCache(file));
    absl::StatusOr<SafetensorsFile> parsed;
    row.parse.push_back(TimeSeconds([&] { parsed = ReadSafetensors(file); }));
    RETURN_IF_ERROR(parsed.status());

    absl::Status s;
    row.write.push_back(
        TimeSeconds([&] { s = PlainWrite(plain, buf, row.bytes); }));
    RETURN_IF_ERROR(s);
    RETURN_IF_ERROR(DropCache(plain));
    row.read.push_back(TimeSeconds([&] { s = PlainRead(plain, buf); }));
    RETURN_IF_ERROR(s);
    RETURN_IF_ERROR(DropCache(plain));
    row.read_fresh.push_back(TimeSeconds([&] {
      std::unique_ptr<char[]> fresh(new char[row.bytes]);
      s = PlainReadInto(plain, fresh.get(), row.bytes);
    }));
    RETURN_IF_ERROR(s);
    std::error_code ignored;
    fs::remove(plain, ignored);
  }
  std::error_code ignored;
  fs::remove_all(ckpt_dir, ignored);
  return row;
}

double MBps(int64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0.0;
}

absl::StatusOr<fs::path> MakeDir(const std::string& flag) {
  fs::path parent = flag;
  if (parent.empty()) {
    std::error_code error;
    parent = fs::read_symlink("/proc/self/exe", error).parent_path();
    if (error) parent = fs::temp_directory_path();
  }
  std::error_code error;
  fs::create_directories(parent, error);
  if (error) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dir: cannot create ", parent.string(), ": ", error.message()));
  }
  std::string pattern = (parent / "checkpoint_bench.XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr)
    return Errno("--dir: cannot create a directory in", parent.string());
  return fs::path(pattern);
}

int Run(int argc, char** argv) {
  Args args(argc, argv, {"sizes", "rounds", "dir"}, {"glibc-malloc"});
  if (!args.ok() || !args.positional().empty()) {
    std::fprintf(
        stderr,
        "checkpoint_bench: %s\nusage: checkpoint_bench "
        "[--sizes 8,64,256] [--rounds 3] [--dir DIR] [--glibc-malloc]\n",
        args.ok() ? "unexpected argument" : args.error().c_str());
    return 2;
  }
  std::vector<int64_t> sizes;
  for (absl::string_view part :
       absl::StrSplit(args.Str("sizes", "8,64,256"), ',')) {
    int64_t mb = 0;
    if (!absl::SimpleAtoi(part, &mb) || mb < 1 || mb > 4096) {
      std::fprintf(stderr,
                   "checkpoint_bench: --sizes: '%.*s' is not a size in MB "
                   "(1..4096)\n",
                   static_cast<int>(part.size()), part.data());
      return 2;
    }
    sizes.push_back(mb);
  }
  const long rounds = args.Int("rounds", 3);
  if (rounds < 1 || rounds > 20) {
    std::fprintf(stderr, "checkpoint_bench: --rounds must be 1..20\n");
    return 2;
  }
  // As gpipe-worker runs: freed tensors stay in the heap, so a restore
  // after the first reads into pages that are already mapped.
  const bool glibc_malloc = args.Has("glibc-malloc");
  if (!glibc_malloc) KeepFreedMemory();
  absl::StatusOr<fs::path> made = MakeDir(args.Str("dir", ""));
  if (!made.ok()) {
    std::fprintf(stderr, "checkpoint_bench: %s\n",
                 made.status().ToString().c_str());
    return 1;
  }
  ScopedDir dir(*made);
  std::printf("directory %s, median of %ld rounds, MB = 10^6 bytes, %s\n",
              dir.path().c_str(), rounds,
              glibc_malloc ? "glibc's malloc defaults"
                           : "freed memory kept in the heap (as the worker)");
  std::printf("%9s %10s %10s %10s %10s %12s %12s %8s %8s %8s %9s %9s %9s %9s\n",
              "size MB", "save MB/s", "plain w", "restore", "plain r",
              "save/plain", "restore/plain", "sha256", "read st", "r fresh",
              "upload", "up/save", "fetch", "fetch/rst");
  for (int64_t mb : sizes) {
    absl::StatusOr<Row> row =
        MeasureSize(mb, static_cast<int>(rounds), dir.path());
    if (!row.ok()) {
      std::fprintf(stderr, "checkpoint_bench: %lld MB: %s\n",
                   static_cast<long long>(mb), row.status().ToString().c_str());
      return 1;
    }
    const double save = MBps(row->bytes, Median(row->save));
    const double write = MBps(row->bytes, Median(row->write));
    const double restore = MBps(row->bytes, Median(row->restore));
    const double read = MBps(row->bytes, Median(row->read));
    const double upload = MBps(row->bytes, Median(row->upload));
    const double fetch = MBps(row->bytes, Median(row->fetch));
    std::printf(
        "%9.1f %10.0f %10.0f %10.0f %10.0f %12.2f %12.2f %8.0f %8.0f %8.0f "
        "%9.0f %9.2f %9.0f %9.2f\n",
        static_cast<double>(row->bytes) / 1e6, save, write, restore, read,
        save / write, restore / read, MBps(row->bytes, Median(row->sha256)),
        MBps(row->bytes, Median(row->parse)),
        MBps(row->bytes, Median(row->read_fresh)), upload, upload / save, fetch,
        fetch / restore);
    std::fflush(stdout);
  }
  std::printf(
      "save = SaveStageCheckpoint (safetensors write, fsync, rename, fsync "
      "dir, sha256 of the file); restore = RestoreStageCheckpoint from a "
      "cold page cache (sha256 check, read, copy into the stage); plain = "
      "write + fsync / read of the same bytes in the same directory; "
      "sha256 and read st = the restore's two reads alone (Sha256File, "
      "ReadSafetensors), each from a cold page cache; r fresh = the plain read "
      "into newly allocated memory of the file's size; upload = the same "
      "checkpoint through a controller on loopback (encode + sha256 + gRPC "
      "stream, the controller's write + sha256 + fsync + rename), up/save its "
      "speed over save's; fetch = FetchCheckpoint from a cold page cache into "
      "the stage, fetch/rst over restore's\n");
  return 0;
}

}  // namespace
}  // namespace gpipe::bench

int main(int argc, char** argv) { return gpipe::bench::Run(argc, argv); }
