// What the controller's tests share: a small job spec (five layers, two of
// them without parameters) and a stage's checkpoint as a worker writes and
// reports it, in the place the checkpoint layout names.
#ifndef GPIPE_TESTS_SUPPORT_CONTROLLER_FIXTURES_H_
#define GPIPE_TESTS_SUPPORT_CONTROLLER_FIXTURES_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "gpipe/v1/controller.pb.h"

namespace gpipe::test_support {

// The five layers of the spec below.
inline constexpr int64_t kControllerSpecLayers = 5;

// The spec with `stages` stages (M=4, 10 steps, batch 32), as JSON parses
// it and not validated (the controller must do that).
gpipe::v1::JobSpec ControllerSpec(int64_t stages = 2);
// The same with a checkpoint every 2 steps and `max_restarts`.
gpipe::v1::JobSpec RecoverableSpec(int64_t stages, int64_t max_restarts);
// `json` as a JobSpec (EXPECTs that it parses).
gpipe::v1::JobSpec ParseSpec(std::string_view json);

// Writes the checkpoint file of `a`'s stage for `step` holding `bytes`
// (default: "stage S at step N") and returns the report that names it.
gpipe::v1::WorkerMessage Checkpointed(const gpipe::v1::Assignment& a,
                                      int64_t step, std::string bytes = "");

// The progress report of `a`'s stage having completed `step` steps, which a
// stage sends before it reports that step's checkpoint.
gpipe::v1::WorkerMessage Progressed(const gpipe::v1::Assignment& a,
                                    int64_t step);

}  // namespace gpipe::test_support

#endif  // GPIPE_TESTS_SUPPORT_CONTROLLER_FIXTURES_H_
