// A Link is one end of the connection between two neighbouring stages:
// activations travel downstream, gradients upstream, and a few scalars (the
// squared gradient norm for global clipping) along the chain. Messages from
// the peer arrive in the order it sent them. The stage runtime is written
// against this interface; in-process and gRPC links implement it.
#ifndef GPIPE_SERVICES_TRANSPORT_LINK_H_
#define GPIPE_SERVICES_TRANSPORT_LINK_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/tensor/tensor.h"

namespace gpipe {

enum class MessageKind : uint8_t {
  kActivation,   // forward output of micro-batch m, sent downstream
  kGradient,     // gradient of that output, sent back upstream
  kGradSquares,  // running sum of squared gradients (downstream), then the
                 // total (upstream), for global-norm clipping
  kEvalEnd,      // no more evaluation batches follow
  kEvalTaken,    // upstream: evaluation batch micro_batch was taken off the
                 // receiver's queue (the credit for the next one)
  kEvalFailed,   // either way: stage micro_batch failed its part of the
                 // evaluation; the receiver ends its own and passes it on
  kReduceSlice,  // between replicas of a stage (GradientReducer): a slice
                 // of the sender's gradient nodes (micro_batch 0) or of
                 // the total (micro_batch 1), or the sender's micro-batches'
                 // per-micro-batch statistics (kReduceRowsPhase)
};

// The kReduceSlice phase (micro_batch) that carries a replica's rows of
// per-micro-batch statistics (GradientReducer::GatherRows).
inline constexpr int64_t kReduceRowsPhase = -2;

// Step used by messages of an evaluation pass rather than a training step.
inline constexpr int64_t kEvalStep = -1;

struct Message {
  MessageKind kind = MessageKind::kActivation;
  int64_t step = 0;
  int64_t micro_batch = -1;
  Tensor tensor;      // activations and gradients
  double scalar = 0;  // kGradSquares
};

std::string Describe(
    const Message& m);  // "gradient of micro-batch 3 at step 7"

class Link {
 public:
  virtual ~Link() = default;
  // Queues a message for the peer; may block while the peer is behind
  // (back-pressure). Fails once the link is closed.
  virtual absl::Status Send(Message message) = 0;
  // The next message from the peer, blocking until one arrives; fails with
  // CANCELLED once the link is closed. Tensors come back counted by the
  // receiving thread's current allocator (allocated there, or counted in it
  // with Tensor::CountIn), so a stage's activation memory includes the
  // inputs and gradients it holds.
  virtual absl::StatusOr<Message> Receive() = 0;
  // Closes both directions and wakes every blocked Send and Receive.
  virtual void Close() = 0;
  // The stage is done with this link, normally or not. An end that a
  // server's handler lent (ExchangeLink) lets the handler return; others need
  // nothing.
  virtual void Release() {}
  // Bytes of tensor payload this end sent and received so far.
  virtual int64_t bytes_sent() const = 0;
  virtual int64_t bytes_received() const = 0;
  // True when Send takes device tensors as they are and Receive returns
  // device tensors (the CUDA IPC plane): a GPU stage then skips its copies
  // through the host. May wait until the link's data plane is agreed on.
  virtual bool CarriesDeviceTensors() { return false; }
  // Host memory this end maps for the link beside its messages (the
  // shared-memory segment it offered, or the agreed plane's): the worker
  // counts it against its memory for stages.
  virtual int64_t mapped_bytes() const { return 0; }
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_LINK_H_
