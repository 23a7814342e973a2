// Fuzzes what a stage reads when it restores a checkpoint. The first input
// byte picks the file under attack; the rest is its content:
//   even: a stage's safetensors file. It is parsed from memory
//         (ParseSafetensors), then written next to a manifest that carries
//         its true sha256, so that RestoreStageCheckpoint reads it into a
//         small model (the digest check would otherwise stop every input);
//   odd:  MANIFEST.json. It is read (ReadManifest, ReadVerifiedManifest) and
//         restored from, next to a valid stage file written at start-up.
// A restore that fails must leave the stage's tensors as they were
// (stage_checkpoint.h); one that succeeds must have read the manifest.
//
// GPIPE_FUZZ_WRITE_SEEDS=DIR writes the two seed inputs (a valid file of
// each kind) to DIR and exits: that is how corpus/checkpoint/ was made.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/json_util.h"
#include "gpipe/v1/checkpoint.pb.h"
#include "gpipe/v1/job.pb.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/stage.h"
#include "services/pipeline/stage_checkpoint.h"
#include "services/storage/manifest.h"
#include "services/storage/safetensors.h"
#include "services/storage/sha256.h"

namespace {

namespace v1 = gpipe::v1;
namespace fs = std::filesystem;

// A small model with every kind of checkpoint tensor: weights, BatchNorm
// buffers, Adam moments.
constexpr char kSpec[] = R"({
  "name": "checkpoint-fuzzer",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [4]}},
    "layers": [
      {"linear": {"inFeatures": 4, "outFeatures": 4}},
      {"batchNorm": {"features": 4}},
      {"relu": {}},
      {"linear": {"inFeatures": 4, "outFeatures": 2}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.01, "adamw": {}},
  "data": {"synthetic": {"task": "CLASSES", "features": 4, "classes": 2,
                         "trainSamples": 8, "testSamples": 4}},
  "batchSize": 4,
  "steps": 1,
  "seed": 1
})";
constexpr int64_t kLayers = 4;

void Fail(const std::string& what) {
  std::fprintf(stderr, "checkpoint_fuzzer: %s\n", what.c_str());
  std::abort();
}

void CheckError(const absl::Status& s) {
  if (!s.ok() && s.message().empty()) Fail("an error without a message");
}

void WriteFile(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) Fail(absl::StrCat("cannot write ", path.string()));
}

// The stage's parameters and optimizer state as bytes: compared bitwise, as
// a restore that succeeded earlier may have left NaNs (never equal to
// themselves) in them.
std::string State(gpipe::Stage& stage) {
  std::string out;
  auto add = [&out](const gpipe::NamedTensor& t) {
    const std::vector<float> v = t.tensor->ToVector();
    out.append(reinterpret_cast<const char*>(v.data()),
               v.size() * sizeof(float));
  };
  for (const gpipe::NamedTensor& t : stage.model().StateTensors()) add(t);
  for (const gpipe::NamedTensor& t : stage.optimizer().State()) add(t);
  return out;
}

// One directory per process (libFuzzer's -jobs runs several), removed at
// exit; the stage the inputs restore into; a valid stage file.
struct Fixture {
  fs::path dir;
  std::unique_ptr<gpipe::Stage> stage;
  std::string stage_file;  // its bytes
  std::string manifest;    // a valid manifest for stage_file

  Fixture() {
    const char* shm = "/dev/shm";
    dir = fs::path(fs::exists(shm) ? shm : fs::temp_directory_path()) /
          absl::StrCat("checkpoint_fuzzer-", getpid());
    fs::remove_all(dir);
    fs::create_directories(dir / "valid");
    fs::create_directories(dir / "input");
    absl::StatusOr<v1::JobSpec> spec = gpipe::ParseJobSpecJson(kSpec);
    if (!spec.ok()) Fail(std::string(spec.status().message()));
    absl::StatusOr<std::unique_ptr<gpipe::Dataset>> dataset =
        gpipe::OpenJobDataset(*spec);
    if (!dataset.ok()) Fail(std::string(dataset.status().message()));
    gpipe::StagePlacement p;
    p.layer_begin = 0;
    p.layer_end = kLayers;
    absl::StatusOr<std::unique_ptr<gpipe::Stage>> made = gpipe::Stage::Create(
        *spec, p, std::shared_ptr<const gpipe::Dataset>(std::move(*dataset)),
        nullptr, nullptr);
    if (!made.ok()) Fail(std::string(made.status().message()));
    stage = std::move(*made);
    const fs::path file = dir / "valid" / "stage-0.safetensors";
    absl::StatusOr<gpipe::WrittenCheckpoint> written =
        gpipe::SaveStageCheckpoint(*stage, 3, file.string());
    if (!written.ok()) Fail(std::string(written.status().message()));
    std::ifstream in(file, std::ios::binary);
    stage_file.assign(std::istreambuf_iterator<char>(in), {});
    v1::CheckpointManifest m;
    m.set_job_id("fuzz");
    m.set_step(3);
    v1::CheckpointFile* f = m.add_files();
    f->set_path(file.filename().string());
    f->set_sha256(written->sha256);
    f->set_bytes(written->bytes);
    f->set_layer_begin(0);
    f->set_layer_end(kLayers);
    const fs::path manifest_path =
        dir / "valid" / gpipe::storage::kManifestName;
    if (!gpipe::storage::WriteManifest(manifest_path.string(), m).ok())
      Fail("cannot write the manifest");
    std::ifstream min(manifest_path, std::ios::binary);
    manifest.assign(std::istreambuf_iterator<char>(min), {});
  }
  ~Fixture() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

Fixture* fixture = nullptr;

// Restores from `manifest_path`; a failure must leave the stage untouched.
void Restore(const fs::path& manifest_path) {
  const std::string before = State(*fixture->stage);
  absl::StatusOr<int64_t> step =
      gpipe::RestoreStageCheckpoint(*fixture->stage, manifest_path.string());
  CheckError(step.status());
  if (!step.ok() && State(*fixture->stage) != before)
    Fail("a failed restore changed the stage");
}

void FuzzStageFile(std::string_view bytes) {
  CheckError(gpipe::ParseSafetensors(bytes, "input").status());
  const fs::path file = fixture->dir / "input" / "stage-0.safetensors";
  WriteFile(file, bytes);
  v1::CheckpointManifest m;
  m.set_step(1);
  v1::CheckpointFile* f = m.add_files();
  f->set_path(file.filename().string());
  f->set_sha256(gpipe::storage::Sha256Hex(bytes));
  f->set_bytes(static_cast<int64_t>(bytes.size()));
  f->set_layer_begin(0);
  f->set_layer_end(kLayers);
  const fs::path manifest_path =
      fixture->dir / "input" / gpipe::storage::kManifestName;
  // Written directly: WriteManifest's fsyncs would cost most of the time.
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(m, &json).ok())
    Fail("cannot print the manifest");
  WriteFile(manifest_path, json);
  Restore(manifest_path);
}

void FuzzManifest(std::string_view bytes) {
  const fs::path manifest_path =
      fixture->dir / "valid" / gpipe::storage::kManifestName;
  WriteFile(manifest_path, bytes);
  CheckError(gpipe::storage::ReadManifest(manifest_path.string()).status());
  CheckError(
      gpipe::storage::ReadVerifiedManifest(manifest_path.string()).status());
  Restore(manifest_path);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Hostile strings make protobuf log each non-UTF-8 field: noise that
  // slows the run and buries a finding.
  google::protobuf::SetLogHandler(nullptr);
  fixture = new Fixture();
  std::atexit([] { delete fixture; });
  if (const char* seeds = std::getenv("GPIPE_FUZZ_WRITE_SEEDS")) {
    fs::create_directories(seeds);
    WriteFile(fs::path(seeds) / "stage_file",
              std::string(1, '\0') + fixture->stage_file);
    WriteFile(fs::path(seeds) / "manifest",
              std::string(1, '\1') + fixture->manifest);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (1 << 20)) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  if (data[0] % 2 == 0) {
    FuzzStageFile(bytes);
  } else {
    FuzzManifest(bytes);
  }
  return 0;
}
