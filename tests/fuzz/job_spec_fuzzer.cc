// Fuzzes the path a job spec takes from a user to the scheduler: JSON ->
// JobSpec (ParseJobSpecJson, as gpipectl submit and the controller read it)
// -> ValidateJobSpec -> PartitionJob for K stages and, as the controller
// does when workers are missing, for every smaller K down to min_stages.
//
// The same bytes are also read as a binary JobSpec, which reaches the
// validator with field values that JSON rarely produces (a spec arriving
// over SubmitJob is binary). A spec the validator accepts must partition
// without an error: validation is the one place that decides whether a job
// can run (services/pipeline/job_spec.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/stubs/logging.h"
#include "gpipe/v1/job.pb.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/partitioner.h"

namespace {

void CheckError(const absl::Status& s) {
  if (!s.ok() && s.message().empty()) std::abort();
}

// What the controller does with an accepted spec.
void Schedule(const gpipe::v1::JobSpec& spec) {
  const int64_t k = gpipe::StageCount(spec);
  absl::StatusOr<std::vector<int64_t>> balance = gpipe::PartitionJob(spec, k);
  // The validator checked K against the layers and the explicit balance.
  if (!balance.ok()) std::abort();
  int64_t layers = 0;
  for (int64_t b : *balance) {
    if (b < 1) std::abort();
    layers += b;
  }
  if (layers != spec.model().layers_size()) std::abort();
  // Elastic: fewer stages than asked, cut by the cost model.
  gpipe::v1::JobSpec cut = spec;
  cut.mutable_pipeline()->clear_balance();
  const int64_t min = std::max<int64_t>(1, spec.pipeline().min_stages());
  for (int64_t smaller = k - 1; smaller >= min && smaller >= k - 4; --smaller) {
    CheckError(gpipe::PartitionJob(cut, smaller).status());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Hostile strings make protobuf log each non-UTF-8 field: noise that
  // slows the run and buries a finding.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Specs are small; the controller caps a request well below this.
  if (size > 64 << 10) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<gpipe::v1::JobSpec> spec = gpipe::ParseJobSpecJson(text);
  CheckError(spec.status());
  if (spec.ok()) Schedule(*spec);

  gpipe::v1::JobSpec binary;
  if (binary.ParseFromArray(data, static_cast<int>(size))) {
    absl::Status valid = gpipe::ValidateJobSpec(binary);
    CheckError(valid);
    if (valid.ok()) Schedule(binary);
  }
  return 0;
}
