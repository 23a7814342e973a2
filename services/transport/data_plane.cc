#include "services/transport/data_plane.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "services/transport/shm_segment.h"

namespace gpipe {

const char* DataPlaneName(DataPlaneKind plane) {
  switch (plane) {
    case DataPlaneKind::kGrpc:
      return "grpc";
    case DataPlaneKind::kShm:
      return "shm";
    case DataPlaneKind::kCudaIpc:
      return "cuda_ipc";
  }
  return "?";
}

const char* DataPlaneModeName(DataPlaneMode mode) {
  switch (mode) {
    case DataPlaneMode::kGrpc:
      return "grpc";
    case DataPlaneMode::kShm:
      return "shm";
    case DataPlaneMode::kAuto:
      return "auto";
    case DataPlaneMode::kCudaIpc:
      return "cuda_ipc";
  }
  return "?";
}

absl::StatusOr<DataPlaneMode> ParseDataPlaneMode(const std::string& text) {
  if (text == "grpc") return DataPlaneMode::kGrpc;
  if (text == "shm") return DataPlaneMode::kShm;
  if (text == "auto") return DataPlaneMode::kAuto;
  if (text == "cuda_ipc") return DataPlaneMode::kCudaIpc;
  return absl::InvalidArgumentError(absl::StrCat(
      "--data_plane must be auto, grpc or shm (or cuda_ipc between "
      "GPU stages), not '",
      text, "'"));
}

absl::Status ValidateDataPlaneOptions(const DataPlaneOptions& o) {
  if (o.ring_bytes < kMinShmRingBytes || o.ring_bytes > kMaxShmRingBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shm_ring_bytes ", o.ring_bytes, " is outside [",
                     kMinShmRingBytes, ", ", kMaxShmRingBytes, "]"));
  }
  // Rings follow each other in the segment and tensors stay in them as
  // float storage: whole pages keep every chunk aligned.
  if (o.ring_bytes % kShmRingGranule != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shm_ring_bytes ", o.ring_bytes,
                     " is not a multiple of ", kShmRingGranule));
  }
  if (o.chunk_bytes < 4096 || o.chunk_bytes > o.ring_bytes / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory chunk of ", o.chunk_bytes,
                     " bytes must be at least 4096 and at most half the ring (",
                     o.ring_bytes / 2, ")"));
  }
  if (o.cuda_ipc_ring_bytes < kMinShmRingBytes ||
      o.cuda_ipc_ring_bytes > kMaxShmRingBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cuda_ipc_ring_bytes ", o.cuda_ipc_ring_bytes, " is outside [",
        kMinShmRingBytes, ", ", kMaxShmRingBytes, "]"));
  }
  return absl::OkStatus();
}

HostIdentity ThisHost() {
  HostIdentity h;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::getline(boot, h.boot_id);
  absl::StripAsciiWhitespace(&h.boot_id);
  char link[256];
  const ssize_t n = readlink("/proc/self/ns/ipc", link, sizeof(link) - 1);
  if (n > 0) h.ipc_namespace.assign(link, static_cast<size_t>(n));
  return h;
}

std::string OfferMismatch(const gpipe::v1::ShmOffer& offer,
                          const HostIdentity& here) {
  if (offer.boot_id().empty() || offer.boot_id() != here.boot_id) {
    return absl::StrCat("another host (boot id '", offer.boot_id(), "', here '",
                        here.boot_id, "')");
  }
  if (offer.ipc_namespace() != here.ipc_namespace) {
    return absl::StrCat("another IPC namespace (", offer.ipc_namespace(),
                        ", here ", here.ipc_namespace, ")");
  }
  if (offer.ring_bytes() < kMinShmRingBytes ||
      offer.ring_bytes() > kMaxShmRingBytes) {
    return absl::StrCat("a ring of ", offer.ring_bytes(),
                        " bytes is out of bounds");
  }
  if (offer.ring_bytes() % kShmRingGranule != 0) {
    return absl::StrCat("a ring of ", offer.ring_bytes(),
                        " bytes is not a multiple of ", kShmRingGranule);
  }
  if (offer.segment_bytes() != ShmSegmentBytes(offer.ring_bytes())) {
    return absl::StrCat("a segment of ", offer.segment_bytes(),
                        " bytes does not hold two rings of ",
                        offer.ring_bytes());
  }
  if (offer.pid() <= 0 || offer.fd() < 0) {
    return absl::StrCat("no such process or descriptor (pid ", offer.pid(),
                        ", fd ", offer.fd(), ")");
  }
  return "";
}

}  // namespace gpipe
