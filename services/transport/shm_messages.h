// Messages <-> chunks of the shared-memory ring. A message goes out as the
// same frames as on the wire (frame_codec.h), each one a chunk: its
// serialized fields, then (64-byte aligned) its payload, copied once from
// the tensor. A received chunk goes through the same FrameAssembler
// (fencing, header against byte counts); when it is a whole tensor and the
// channel allows (ShmChannel::TryHold), the tensor's storage is the chunk
// itself and the chunk is given back when the tensor is freed, so each
// byte is copied once end to end. Otherwise the payload is copied out and
// the chunk given back at once.
#ifndef GPIPE_SERVICES_TRANSPORT_SHM_MESSAGES_H_
#define GPIPE_SERVICES_TRANSPORT_SHM_MESSAGES_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/transport/frame_codec.h"
#include "services/transport/link.h"
#include "services/transport/shm_channel.h"

namespace gpipe {

// Writes `m` into `shm` chunk by chunk (blocking while the ring is full).
absl::Status WriteShmMessage(const Message& m, const std::string& job_id,
                             int64_t epoch, ShmChannel& shm);

// Feeds the peer's chunk `c` (already accepted by shm->Next) to
// `assembler`; a complete message when `c` ends one. A chunk whose fields
// do not parse, or that carries a payload field or descriptor of its own,
// is INVALID_ARGUMENT.
absl::StatusOr<std::optional<Message>> ReadShmChunk(
    const std::shared_ptr<ShmChannel>& shm, const ShmChunk& c,
    FrameAssembler& assembler);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_SHM_MESSAGES_H_
