// Fuzzes the readers of a user's data files, which come from anywhere. The
// first input byte picks the reader; the rest is the file:
//   0: a .npy file (ReadNpy, then both conversions);
//   1: a .safetensors file's tensor "inputs" (ReadSafetensorsArray);
//   2: a CSV table (CsvDataset::Open with a header and target "label", and
//      again without a header and target "0"), gathered and standardized;
//   3: a .npy file of inputs [N, 4] next to a valid targets file
//      (TensorFilesDataset::Open for a float and an int model), gathered;
//   4: a PGM image (ParsePgm), every pixel in [0, 1];
//   5: an image file of any kind (DecodeImage: PNG, JPEG, PGM), as grey
//      and as RGB, every value in [0, 1].
// Whatever opens must gather every sample of both splits without reading
// out of bounds; whatever fails must say why.
//
// GPIPE_FUZZ_WRITE_SEEDS=DIR writes a valid input of each kind to DIR and
// exits: that is how corpus/data_file/ was made.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "gpipe/v1/job.pb.h"
#include "services/data/csv.h"
#include "services/data/image_file.h"
#include "services/data/npy.h"
#include "services/data/numeric_array.h"
#include "services/data/pgm.h"
#include "services/data/safetensors_array.h"
#include "services/data/tensor_files.h"
#include "services/storage/safetensors.h"
#include "tests/support/image_encode.h"

namespace {

namespace fs = std::filesystem;

const fs::path& Dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() /
                 ("data_file_fuzzer_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

std::string WriteFile(const std::string& name, std::string_view bytes) {
  const std::string path = (Dir() / name).string();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

void MustSay(const absl::Status& s) {
  if (!s.ok() && s.message().empty()) std::abort();
}

// A .npy file of float32 [n, 4] or int64 [n], C order, little-endian.
std::string Npy(const std::string& descr, const std::string& shape,
                std::string_view data) {
  std::string header = "{'descr': '" + descr +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(1);
  out.push_back(0);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  return out + header + std::string(data);
}

std::string Targets() {
  std::string data;
  for (int64_t i = 0; i < 8; ++i) {
    const int64_t y = i % 3;
    data.append(reinterpret_cast<const char*>(&y), sizeof(y));
  }
  return Npy("<i8", "(8,)", data);
}

void GatherAll(const gpipe::Dataset& d) {
  for (gpipe::Split split : {gpipe::Split::kTrain, gpipe::Split::kTest}) {
    std::vector<int64_t> all(static_cast<size_t>(d.size(split)));
    std::iota(all.begin(), all.end(), 0);
    if (all.empty()) continue;
    const gpipe::Batch b = d.Gather(split, all);
    if (b.inputs.dim(0) != static_cast<int64_t>(all.size())) std::abort();
    const gpipe::Tensor t = d.GatherTargets(split, all);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.i32()[i] < -1 || t.i32()[i] >= d.num_classes()) std::abort();
    }
  }
}

void Npy(std::string_view bytes) {
  auto a = gpipe::ReadNpy(WriteFile("x.npy", bytes));
  MustSay(a.status());
  if (!a.ok()) return;
  MustSay(gpipe::ToFloat32(*a).status());
  MustSay(gpipe::ToInt32(*a, "inputs").status());
}

void Safetensors(std::string_view bytes) {
  auto a =
      gpipe::ReadSafetensorsArray(WriteFile("x.safetensors", bytes), "inputs");
  MustSay(a.status());
  if (a.ok()) MustSay(gpipe::ToFloat32(*a).status());
}

void Csv(std::string_view bytes) {
  const std::string path = WriteFile("t.csv", bytes);
  for (bool header : {true, false}) {
    gpipe::v1::CsvFile spec;
    spec.set_path(path);
    spec.set_header(header);
    spec.set_target(header ? "label" : "0");
    auto d = gpipe::CsvDataset::Open(spec);
    MustSay(d.status());
    if (!d.ok()) continue;
    GatherAll(**d);
    const auto stats = (*d)->ComputeStandardization();
    if (stats.mean.size() != (*d)->feature_names().size()) std::abort();
  }
}

void TensorFiles(std::string_view bytes) {
  gpipe::v1::TensorFiles spec;
  spec.set_inputs(WriteFile("inputs.npy", bytes));
  spec.set_targets(WriteFile("targets.npy", Targets()));
  for (gpipe::DType dtype : {gpipe::DType::kF32, gpipe::DType::kI32}) {
    auto d = gpipe::TensorFilesDataset::Open(spec, gpipe::Shape{4}, dtype);
    MustSay(d.status());
    if (d.ok()) GatherAll(**d);
  }
}

void Pgm(std::string_view bytes) {
  auto image = gpipe::ParsePgm(bytes, "image.pgm");
  MustSay(image.status());
  if (!image.ok()) return;
  if (static_cast<int64_t>(image->pixels.size()) !=
      image->width * image->height) {
    std::abort();
  }
  for (float v : image->pixels) {
    if (!(v >= 0.0f && v <= 1.0f)) std::abort();
  }
}

void Image(std::string_view bytes) {
  for (int channels : {1, 3}) {
    auto image = gpipe::DecodeImage(bytes, "image", channels);
    MustSay(image.status());
    if (!image.ok()) return;
    if (static_cast<int64_t>(image->values.size()) !=
        image->width * image->height * channels) {
      std::abort();
    }
    for (float v : image->values) {
      if (!(v >= 0.0f && v <= 1.0f)) std::abort();
    }
  }
}

void WriteSeeds(const std::string& dir) {
  fs::create_directories(dir);
  std::string floats;
  for (int i = 0; i < 32; ++i) {
    const float v = static_cast<float>(i % 5) * 0.5f;
    floats.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  const std::string npy = Npy("<f4", "(8, 4)", floats);
  gpipe::Tensor x = gpipe::Tensor::Zeros(gpipe::Shape{8, 4});
  const std::string st = (Dir() / "seed.safetensors").string();
  if (!gpipe::WriteSafetensors(st, {{"inputs", &x}}, {}).ok()) std::abort();
  std::ifstream in(st, std::ios::binary);
  const std::string safetensors((std::istreambuf_iterator<char>(in)), {});
  const std::string csv = "a,label,b\n1,0,2.5\n3,1,-4\n5,2,6e-1\n7,0,8\n";
  const std::string pgm = std::string("P5\n# seed\n2 2\n255\n") +
                          std::string("\x00\x40\x80\xff", 4);
  std::vector<uint8_t> pixels(8 * 8 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = (i * 37) & 0xff;
  const std::string png = gpipe::testing_images::EncodePng(pixels, 8, 8, 3);
  const std::string jpeg =
      gpipe::testing_images::EncodeJpeg(pixels, 8, 8, 3, 90);
  const std::pair<char, std::string> seeds[] = {
      {0, npy}, {1, safetensors}, {2, csv},  {3, npy},
      {4, pgm}, {5, png},         {11, jpeg}};
  for (const auto& [kind, body] : seeds) {
    std::ofstream(dir + "/seed-" + std::to_string(kind), std::ios::binary)
        << kind << body;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("GPIPE_FUZZ_WRITE_SEEDS")) {
    WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  switch (data[0] % 6) {
    case 0:
      Npy(bytes);
      break;
    case 1:
      Safetensors(bytes);
      break;
    case 2:
      Csv(bytes);
      break;
    case 3:
      TensorFiles(bytes);
      break;
    case 4:
      Pgm(bytes);
      break;
    case 5:
      Image(bytes);
      break;
  }
  return 0;
}
