// A job's state, step and loss as gpipectl's list, status and watch print
// them.
#ifndef GPIPE_CLI_JOB_TEXT_H_
#define GPIPE_CLI_JOB_TEXT_H_

#include <string>

#include "gpipe/v1/controller.pb.h"

namespace gpipe::cli {

// "RUNNING"; "UNKNOWN" for a state the controller did not set.
std::string StateName(gpipe::v1::JobState state);

// "120/1000": steps completed of the job's steps.
std::string StepText(const gpipe::v1::JobStatus& s);

// The last step's loss to four places, "-" before the first step, and "not
// finite" for a job that failed for a loss that was not.
std::string LossText(const gpipe::v1::JobStatus& s);

}  // namespace gpipe::cli

#endif  // GPIPE_CLI_JOB_TEXT_H_
