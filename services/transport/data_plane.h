// Which data plane carries the tensor bytes between two neighbouring stages,
// and what a worker allows (--data_plane). gRPC frames work everywhere; the
// shared-memory plane only between stages on one host that can map the
// same segment; the CUDA IPC plane between two GPU stages on one host. The
// planes themselves are DataPlane implementations (plane.h); the choice is
// made per link by PlaneNegotiator (plane_negotiator.h).
#ifndef GPIPE_SERVICES_TRANSPORT_DATA_PLANE_H_
#define GPIPE_SERVICES_TRANSPORT_DATA_PLANE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "gpipe/v1/stage.pb.h"

namespace gpipe {

enum class DataPlaneKind : uint8_t {
  kGrpc,     // tensor bytes inside Exchange frames
  kShm,      // messages in a shared-memory ring, notified through the segment
  kCudaIpc,  // device tensors copied through an exported device buffer
};

// What a worker allows (--data_plane).
enum class DataPlaneMode : uint8_t {
  kGrpc,     // frames only
  kShm,      // shared memory or fail
  kAuto,     // CUDA IPC, else shared memory, else frames: the best that works
  kCudaIpc,  // CUDA IPC between two GPU stages or fail
};

const char* DataPlaneName(DataPlaneKind plane);  // "grpc", "shm", "cuda_ipc"
const char* DataPlaneModeName(DataPlaneMode mode);
// "auto", "grpc", "shm" or "cuda_ipc"; anything else is INVALID_ARGUMENT.
absl::StatusOr<DataPlaneMode> ParseDataPlaneMode(const std::string& text);

// Bounds on the per-direction ring of a shared-memory segment.
inline constexpr int64_t kMinShmRingBytes = int64_t{1} << 20;
inline constexpr int64_t kMaxShmRingBytes = int64_t{4} << 30;
// Rings are whole pages.
inline constexpr int64_t kShmRingGranule = 4096;

struct DataPlaneOptions {
  DataPlaneMode mode = DataPlaneMode::kGrpc;
  // Each direction's ring; a full ring blocks Send (back-pressure).
  int64_t ring_bytes = int64_t{32} << 20;
  // Largest piece of a tensor that one chunk covers (the channel also caps
  // it at an eighth of the ring). A tensor of one chunk can stay in the
  // ring as the receiver's tensor; larger ones are copied out piece by
  // piece while the sender writes the next.
  int64_t chunk_bytes = int64_t{4} << 20;
  // The stage computes on the GPU (--device cuda): only then is the CUDA
  // IPC plane offered or accepted, and its links carry device tensors.
  bool on_gpu = false;
  // Each direction's ring in the exported device buffer (CUDA IPC plane).
  int64_t cuda_ipc_ring_bytes = int64_t{64} << 20;
};

// INVALID_ARGUMENT naming the bad field when `o` is out of bounds.
absl::Status ValidateDataPlaneOptions(const DataPlaneOptions& o);

// What identifies this host and IPC namespace to a peer: two processes
// whose ids differ cannot share memory (the nonce in the segment then
// proves that they do).
struct HostIdentity {
  std::string boot_id;        // empty when unreadable
  std::string ipc_namespace;  // e.g. "ipc:[4026531839]"
};
HostIdentity ThisHost();

// Why the answering side cannot take `offer` ("" when nothing speaks
// against it before trying to map it): another host or IPC namespace, a
// segment size out of bounds or not matching its rings.
std::string OfferMismatch(const gpipe::v1::ShmOffer& offer,
                          const HostIdentity& here);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_DATA_PLANE_H_
