// Which data plane a link uses, agreed between its two ends over the
// Exchange stream: the upstream end offers what its --data_plane allows
// right after OPEN (a device buffer for CUDA IPC and/or a shared-memory
// segment, each proven by a nonce the peer writes into it), the downstream
// end answers with what it could open. Until an answer arrives, Send
// waits; a link whose planes are refused runs on frames, unless a plane
// was forced (then the link fails with FAILED_PRECONDITION naming why).
// Every refusal is kept, typed, for the log and the worker's metrics.
#ifndef GPIPE_SERVICES_TRANSPORT_PLANE_NEGOTIATOR_H_
#define GPIPE_SERVICES_TRANSPORT_PLANE_NEGOTIATOR_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/transport/cuda_ipc_buffer.h"
#include "services/transport/data_plane.h"
#include "services/transport/frame_data_plane.h"
#include "services/transport/plane.h"
#include "services/transport/shm_segment.h"

namespace gpipe {

// Why the faster planes are not used; empty fields where a plane was used
// or never considered.
struct PlaneRefusal {
  std::string cuda_ipc;  // why not CUDA IPC
  std::string shm;       // why not shared memory
  bool empty() const { return cuda_ipc.empty() && shm.empty(); }
  // "no CUDA IPC: ...; no shared memory: ..." (the non-empty parts).
  std::string ToString() const;
};

class PlaneNegotiator {
 public:
  // `context` and `frames` (the plane every link starts on) outlive this.
  PlaneNegotiator(const PlaneContext& context, FrameDataPlane* frames)
      : context_(context), frames_(frames) {}

  // The downstream end: what it accepts when offered (default: frames
  // only). Before the link reads.
  void set_options(const DataPlaneOptions& options) ABSL_LOCKS_EXCLUDED(mu_);

  // The upstream end, once its reader runs: offers what `options` allow.
  // Fails only when a forced plane cannot even be offered, or the stream
  // broke.
  absl::Status Offer(const DataPlaneOptions& options, int64_t from_stage)
      ABSL_LOCKS_EXCLUDED(mu_);

  // On the reader thread: the peer's offer (downstream end; answers it)
  // and the peer's answer (upstream end). An error rejects the frame.
  absl::Status HandleOffer(const gpipe::v1::Frame& f) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status HandleAnswer(const gpipe::v1::Frame& f) ABSL_LOCKS_EXCLUDED(mu_);
  // On the reader thread, for a message frame while no plane is agreed: a
  // forced plane refuses frames that come without an offer.
  absl::Status CheckFramesAllowed() const ABSL_LOCKS_EXCLUDED(mu_);

  // The plane Send uses, waiting for the answer to an offer (frames when
  // none was made or the link closed meanwhile); a forced plane the peer
  // refused is FAILED_PRECONDITION.
  absl::StatusOr<DataPlane*> AwaitPlane() ABSL_LOCKS_EXCLUDED(mu_);
  // AwaitPlane's choice, waiting at most `timeout` (DEADLINE_EXCEEDED);
  // a link closed before the answer is UNAVAILABLE or why it failed.
  absl::StatusOr<DataPlaneKind> WaitKind(std::chrono::milliseconds timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The agreed plane other than frames, or null (any thread, no waiting).
  DataPlane* agreed() const ABSL_LOCKS_EXCLUDED(mu_);
  // After the answer, whether the plane carries device tensors.
  bool CarriesDeviceTensors() ABSL_LOCKS_EXCLUDED(mu_);
  PlaneRefusal refusal() const ABSL_LOCKS_EXCLUDED(mu_);
  // The agreed plane's DataPlane::mapped_bytes; before the answer, the
  // segment this end offered (0 for none).
  int64_t mapped_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // No answer will come: wakes every waiter and closes the agreed plane
  // with `why`. `read_failure`: why the stream's reading failed (OK for a
  // peer that finished or a local close), for WaitKind.
  void Close(const absl::Status& why, const absl::Status& read_failure)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the agreed plane and waits for its threads (DataPlane::Stop).
  void Stop(const absl::Status& why, bool drain) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status OfferCudaIpc(const DataPlaneOptions& options,
                            gpipe::v1::Frame* offer) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status OfferShm(const DataPlaneOptions& options,
                        gpipe::v1::Frame* offer) ABSL_LOCKS_EXCLUDED(mu_);
  // Opens the offered device buffer and makes it the plane ("" then, with
  // the answer in `answer`), else says why not.
  std::string TakeCudaIpcOffer(const gpipe::v1::Frame& f,
                               const DataPlaneOptions& options,
                               gpipe::v1::Frame* answer)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckFencing(const gpipe::v1::Frame& f, const char* what) const;
  bool answered() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !awaiting_answer_ || closed_;
  }

  const PlaneContext& context_;
  FrameDataPlane* const frames_;

  mutable absl::Mutex mu_;
  DataPlaneOptions options_ ABSL_GUARDED_BY(mu_);
  bool offering_end_ ABSL_GUARDED_BY(mu_) = false;  // Offer was called
  bool offer_seen_ ABSL_GUARDED_BY(mu_) = false;    // HandleOffer was
  bool awaiting_answer_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status read_failure_ ABSL_GUARDED_BY(mu_);
  // Set once (then never replaced: Send and the reader use it unlocked).
  std::unique_ptr<DataPlane> plane_ ABSL_GUARDED_BY(mu_);
  absl::Status plane_status_ ABSL_GUARDED_BY(mu_);  // a forced plane refused
  PlaneRefusal refusal_ ABSL_GUARDED_BY(mu_);
  // What this end offered, until the answer.
  std::unique_ptr<ShmSegment> offered_shm_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<CudaIpcBuffer> offered_cuda_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_PLANE_NEGOTIATOR_H_
