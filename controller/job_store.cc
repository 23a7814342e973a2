#include "controller/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/core/log.h"
#include "services/core/status.h"

namespace gpipe::controller {

namespace v1 = gpipe::v1;

namespace {

constexpr char kSchema[] =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS jobs ("
    "  id TEXT PRIMARY KEY,"
    "  seq INTEGER NOT NULL,"
    "  state TEXT NOT NULL,"  // for people with the sqlite3 shell
    "  epoch INTEGER NOT NULL,"
    "  job BLOB NOT NULL);";

// PATH.lock, locked for this process, with its pid written in for the
// message a second controller gets. The lock goes with the process, so a
// crashed controller leaves none behind; one that is still exiting (a
// restart) is given `wait`. Where the filesystem has no flock, the store
// opens unguarded, as before.
absl::StatusOr<storage::ScopedFd> LockStore(const std::string& path,
                                            absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  const std::string lock_path = path + ".lock";
  storage::ScopedFd fd(
      ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("job store ", path, ": cannot open ", lock_path, ": ",
                     std::strerror(errno)));
  }
  for (;;) {
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) break;
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      LogWarning(
          "job store %s: cannot lock %s (%s): a second controller on "
          "this store would not be refused",
          path, lock_path, std::strerror(errno));
      return fd;
    }
    if (absl::Now() >= deadline) {
      char holder[320] = {};
      const ssize_t n = ::pread(fd.get(), holder, sizeof(holder) - 1, 0);
      const std::string pid = n > 0 ? std::string(holder, n) : "?";
      return absl::FailedPreconditionError(absl::StrCat(
          "job store ", path, " is in use by another gpipe-controller (pid ",
          absl::StripAsciiWhitespace(pid), " holds ", lock_path,
          "): two controllers must never share a store"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Only a second controller's message reads it: a failed write costs no
  // more than its pid. The host too: in a container the pid is often 1,
  // which named the refused controller itself.
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  const std::string pid = absl::StrCat(
      ::getpid(), host[0] != '\0' ? absl::StrCat(" on ", host) : "", "\n");
  (void)!::ftruncate(fd.get(), 0);
  (void)!::pwrite(fd.get(), pid.data(), pid.size(), 0);
  return fd;
}

}  // namespace

absl::Status JobStore::Error(const std::string& what) const {
  return absl::InternalError(
      absl::StrCat("job store ", path_, ": ", what, ": ", sqlite3_errmsg(db_)));
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(
    const std::string& path, absl::Duration wait) {
  ASSIGN_OR_RETURN(storage::ScopedFd lock, LockStore(path, wait));
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  std::unique_ptr<JobStore> store(new JobStore(path, db, std::move(lock)));
  if (rc != SQLITE_OK) return store->Error("cannot open");
  sqlite3_busy_timeout(db, 5000);
  char* message = nullptr;
  if (sqlite3_exec(db, kSchema, nullptr, nullptr, &message) != SQLITE_OK) {
    const std::string why = message != nullptr ? message : "unknown error";
    sqlite3_free(message);
    return absl::FailedPreconditionError(absl::StrCat(
        "job store ", path, " is not a usable SQLite database: ", why));
  }
  if (sqlite3_prepare_v2(db,
                         "INSERT OR REPLACE INTO jobs (id, seq, state, epoch, "
                         "job) VALUES (?, ?, ?, ?, ?)",
                         -1, &store->put_, nullptr) != SQLITE_OK) {
    return store->Error("cannot prepare the insert");
  }
  if (sqlite3_prepare_v2(db, "DELETE FROM jobs WHERE id = ?", -1,
                         &store->delete_, nullptr) != SQLITE_OK) {
    return store->Error("cannot prepare the delete");
  }
  return store;
}

JobStore::~JobStore() {
  sqlite3_finalize(put_);
  sqlite3_finalize(delete_);
  sqlite3_close(db_);
}

absl::Status JobStore::Put(int64_t seq, const v1::Job& job) {
  const std::string blob = job.SerializeAsString();
  const std::string state = v1::JobState_Name(job.status().state());
  sqlite3_reset(put_);
  sqlite3_bind_text(put_, 1, job.id().data(), job.id().size(),
                    SQLITE_TRANSIENT);
  sqlite3_bind_int64(put_, 2, seq);
  sqlite3_bind_text(put_, 3, state.data(), state.size(), SQLITE_TRANSIENT);
  sqlite3_bind_int64(put_, 4, job.status().epoch());
  sqlite3_bind_blob(put_, 5, blob.data(), blob.size(), SQLITE_TRANSIENT);
  const int rc = sqlite3_step(put_);
  sqlite3_reset(put_);
  if (rc != SQLITE_DONE) return Error(absl::StrCat("cannot store ", job.id()));
  return absl::OkStatus();
}

absl::Status JobStore::Delete(const std::string& id) {
  sqlite3_reset(delete_);
  sqlite3_bind_text(delete_, 1, id.data(), id.size(), SQLITE_TRANSIENT);
  const int rc = sqlite3_step(delete_);
  sqlite3_reset(delete_);
  if (rc != SQLITE_DONE) return Error(absl::StrCat("cannot delete ", id));
  return absl::OkStatus();
}

absl::StatusOr<LoadedJobs> JobStore::LoadAll() {
  sqlite3_stmt* select = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT id, seq, job FROM jobs ORDER BY seq", -1,
                         &select, nullptr) != SQLITE_OK) {
    return Error("cannot read the jobs");
  }
  LoadedJobs loaded;
  int rc = SQLITE_ROW;
  while ((rc = sqlite3_step(select)) == SQLITE_ROW) {
    const unsigned char* id_text = sqlite3_column_text(select, 0);
    const std::string id =
        id_text != nullptr ? reinterpret_cast<const char*>(id_text) : "";
    StoredJob stored;
    stored.seq = sqlite3_column_int64(select, 1);
    const void* blob = sqlite3_column_blob(select, 2);
    const int bytes = sqlite3_column_bytes(select, 2);
    if (sqlite3_column_type(select, 2) != SQLITE_BLOB ||
        !stored.job.ParseFromArray(blob, bytes)) {
      loaded.bad.push_back(absl::StrCat(
          "row ", id, ": the job does not parse (", bytes, " bytes)"));
      continue;
    }
    if (stored.job.id() != id || id.empty()) {
      loaded.bad.push_back(
          absl::StrCat("row ", id, ": holds job \"", stored.job.id(), "\""));
      continue;
    }
    loaded.jobs.push_back(std::move(stored));
  }
  sqlite3_finalize(select);
  if (rc != SQLITE_DONE) return Error("cannot read the jobs");
  return loaded;
}

}  // namespace gpipe::controller
