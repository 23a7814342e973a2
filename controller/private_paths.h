// The controller's own secrets kept out of jobs' paths. The submit-time
// checks read a job's data and init_from files and quote what they read in
// their errors ("no column "x" in ...; its columns are "<the first line>""),
// so a job naming the worker token file handed it to the submitter, who
// could then attach a worker of their own and receive other jobs' stages.
#ifndef GPIPE_CONTROLLER_PRIVATE_PATHS_H_
#define GPIPE_CONTROLLER_PRIVATE_PATHS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gpipe/v1/job.pb.h"

namespace gpipe::controller {

// PERMISSION_DENIED naming the field when one of `spec`'s paths (SpecPaths)
// is one of `private_files`, or a link to it, or a folder holding it (a
// folder of weights is read file by file); OK otherwise. Empty entries of
// `private_files` are ignored.
absl::Status CheckNoPrivatePaths(const gpipe::v1::JobSpec& spec,
                                 const std::vector<std::string>& private_files);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_PRIVATE_PATHS_H_
