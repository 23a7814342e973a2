// The attached workers: who they are, where their Stage service listens,
// whether they are free, and their lease (the time of their last message).
// Each worker has an outbox of ControllerMessages that its Attach handler
// writes to the stream. Not thread-safe (the controller's one mutex guards
// it).
#ifndef GPIPE_CONTROLLER_WORKER_REGISTRY_H_
#define GPIPE_CONTROLLER_WORKER_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpipe/v1/controller.pb.h"

namespace gpipe::controller {

struct WorkerRecord {
  gpipe::v1::WorkerInfo info;       // what ListWorkers returns
  std::string session_key;          // the hello's (never shown)
  std::string certificate;          // its client certificate (PEM), with mTLS
  bool runs_chunks = false;         // WorkerHello.capabilities has "chunks"
  bool runs_zero_bubble_v = false;  // ... and "zb-v"
  uint64_t attach_seq = 0;    // attach order: the scheduler's stable order
  absl::Time last_heartbeat;  // of any message: a report is proof of life
  std::deque<gpipe::v1::ControllerMessage> outbox;

  // Set when the worker leaves the registry (stream ended, lease expired,
  // replaced by a newer stream, controller shutting down): its Attach
  // handler then returns `gone`. The worker sees that status only when it
  // had closed its side already; otherwise its stream is cancelled, since a
  // sync handler cannot end a stream whose reader is blocked in Read.
  bool lost = false;
  // Not given stages before this: it stalled a job (quarantine; each time
  // longer), or
  absl::Time quarantined_until = absl::InfinitePast();
  int64_t quarantines = 0;
  // until it proves alive with a message after this: a neighbour's link to
  // it failed, and a stopped process still holds its lease for a while.
  absl::Time suspect_since = absl::InfinitePast();
  absl::Status gone;
  // Ends the worker's Attach stream from any thread (e.g. cancels the RPC,
  // which also unblocks a write stuck on a peer that stopped reading).
  std::function<void()> disconnect;

  const std::string& id() const { return info.worker_id(); }
  bool idle() const { return info.state() == gpipe::v1::IDLE; }
};

class WorkerRegistry {
 public:
  // Registers the worker of `hello` as IDLE. InvalidArgument without an id
  // or address; AlreadyExists when that id is attached already.
  absl::StatusOr<std::shared_ptr<WorkerRecord>> Add(
      const gpipe::v1::WorkerHello& hello, absl::Time now);

  std::shared_ptr<WorkerRecord> Find(std::string_view id) const;

  // Takes the worker out of the registry (it stays alive for its handler).
  void Remove(std::string_view id);

  // Workers in attach order: all, the ones that may take a stage, and those
  // whose last message is older than `timeout`.
  std::vector<std::shared_ptr<WorkerRecord>> All() const;
  // Free: idle, not quarantined at `now`, and not suspect (or heard from
  // since it became suspect).
  std::vector<std::shared_ptr<WorkerRecord>> Free(absl::Time now) const;
  std::vector<std::shared_ptr<WorkerRecord>> Expired(
      absl::Time now, absl::Duration timeout) const;

  static void Send(WorkerRecord& worker, gpipe::v1::ControllerMessage message);
  static void MarkBusy(WorkerRecord& worker, std::string_view job_id,
                       int64_t stage, int64_t replica = 0);
  static void MarkIdle(WorkerRecord& worker);

 private:
  std::map<std::string, std::shared_ptr<WorkerRecord>, std::less<>> workers_;
  uint64_t next_seq_ = 0;
};

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_WORKER_REGISTRY_H_
