// The controller's durable state: every job (spec and status, which carries
// its state, epoch and committed checkpoints) in one SQLite database in WAL
// mode, so a restarted controller resumes every job. Rows are written whole
// on every change; a row that does not parse is reported, never fatal.
#ifndef GPIPE_CONTROLLER_JOB_STORE_H_
#define GPIPE_CONTROLLER_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpipe/v1/controller.pb.h"
#include "services/storage/file_io.h"

struct sqlite3;
struct sqlite3_stmt;

namespace gpipe::controller {

struct StoredJob {
  int64_t seq = 0;  // submission order
  gpipe::v1::Job job;
};

struct LoadedJobs {
  std::vector<StoredJob> jobs;   // by seq
  std::vector<std::string> bad;  // one message per row that did not parse
};

class JobStore {
 public:
  // Opens (creating) the database at `path`; errors name the path. Holds
  // PATH.lock (an flock) while open: a second controller on the same store
  // is refused, naming the process that has it (two controllers would each
  // run and overwrite the other's jobs) once `wait` has passed (one that is
  // still exiting, as a restart overlaps it, lets go within it).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(
      const std::string& path, absl::Duration wait = absl::Seconds(3));
  ~JobStore();

  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Inserts or replaces the row of `job` (by id).
  absl::Status Put(int64_t seq, const gpipe::v1::Job& job);
  // Removes the row of job `id` (none: OK).
  absl::Status Delete(const std::string& id);
  absl::StatusOr<LoadedJobs> LoadAll();

  const std::string& path() const { return path_; }

 private:
  JobStore(std::string path, sqlite3* db, storage::ScopedFd lock)
      : path_(std::move(path)), db_(db), lock_(std::move(lock)) {}
  absl::Status Error(const std::string& what) const;

  std::string path_;
  sqlite3* db_ = nullptr;
  sqlite3_stmt* put_ = nullptr;
  sqlite3_stmt* delete_ = nullptr;
  storage::ScopedFd lock_;  // released after the database is closed
};

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_JOB_STORE_H_
