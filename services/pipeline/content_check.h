// A submitted job's data and starting weights read value by value, as its
// stages would read them when it starts: a feature that is NaN, a label past
// the head's classes, a weight of another shape. Found at submit, the
// mistake fails the job before it waits for workers; found by a stage, it
// failed only once the job was scheduled, on a busy cluster hours later.
#ifndef GPIPE_SERVICES_PIPELINE_CONTENT_CHECK_H_
#define GPIPE_SERVICES_PIPELINE_CONTENT_CHECK_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/pipeline/init_weights.h"

namespace gpipe {

// The memory a content check of `spec` holds, estimated: its data files as
// read and as converted (5 times their size), init_from's files (a
// folder's .safetensors files), and the model and optimizer state judging
// init_from fills (a FIFO or a device counts 0: the check refuses it
// without reading). None when the spec names no file of its own: synthetic
// data or the built-in Fashion-MNIST files, and no init_from.
absl::StatusOr<std::optional<int64_t>> ContentCheckBytes(
    const gpipe::v1::JobSpec& spec);

// Opens the job's data for its model (OpenJobDataset: every value checked)
// when it comes from files of its own, and loads init_from into tensors of
// the model's and the optimizer's state, as the stages will.
// The spec's paths and data-dependent fields are resolved already. Errors
// are the stages' own, naming the field, the file and the value.
absl::Status CheckJobContents(const gpipe::v1::JobSpec& spec);

// CheckJobContents' part for the starting weights alone: init_from read and
// loaded into the whole model's and optimizer's state (OK without
// init_from). gpipectl local runs it before it starts a cluster.
absl::Status CheckStartingWeights(const gpipe::v1::JobSpec& spec);

// init_from's `weights` loaded into tensors of the whole model's and
// optimizer's state, as CheckJobContents does: the error a stage's own load
// gives names its layers' tensors only, this one every tensor that does not
// fit.
absl::Status CheckInitWeights(const gpipe::v1::JobSpec& spec,
                              const InitWeights& weights);

// The optimizer's state of one parameter by the names its State() gives
// them ("layers.0.weight.exp_avg"), each of the parameter's shape.
std::vector<std::string> OptimizerStateNames(
    const gpipe::v1::OptimizerSpec& optimizer, const std::string& parameter);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_CONTENT_CHECK_H_
