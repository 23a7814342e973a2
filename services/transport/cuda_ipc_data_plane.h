// The CUDA IPC plane: device tensors copied device to device through a
// buffer the upstream stage exported (cuda_ipc_channel.h). The Exchange
// stream carries a descriptor per chunk and a CUDA_IPC_RELEASE per chunk
// back; messages without a tensor stay in frames. The reader thread checks
// descriptors; the receiving stage's thread queues the tensor's copy out in
// ReceiveTensor, chunk by chunk as they arrive, and an OrderedReleaser
// releases each once its copy is done, so that a tensor larger than the
// ring flows through it while the stage goes on. With
// GPIPE_CUDA_IPC_SYNC_RELEASE=1 in the environment the stage's thread waits
// for each copy and releases the chunk itself (the plane's first design,
// kept to compare the two on a GPU).
#ifndef GPIPE_SERVICES_TRANSPORT_CUDA_IPC_DATA_PLANE_H_
#define GPIPE_SERVICES_TRANSPORT_CUDA_IPC_DATA_PLANE_H_

#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/transport/cuda_ipc_channel.h"
#include "services/transport/frame_data_plane.h"
#include "services/transport/ordered_releaser.h"
#include "services/transport/plane.h"

namespace gpipe {

class CudaIpcDataPlane final : public DataPlane {
 public:
  // `frames` carries the messages without a tensor; it outlives the plane.
  CudaIpcDataPlane(const PlaneContext& context,
                   std::unique_ptr<CudaIpcChannel> channel,
                   FrameDataPlane* frames);
  ~CudaIpcDataPlane() override;

  DataPlaneKind kind() const override { return DataPlaneKind::kCudaIpc; }
  bool CarriesDeviceTensors() const override { return true; }
  absl::Status Send(const Message& m) override;
  absl::StatusOr<std::optional<Message>> OnFrame(
      const ReceivedFrame& frame) override;
  absl::Status ReceiveTensor(Message& m) override;
  void Close(const absl::Status& why) override;
  void Stop(const absl::Status& why, bool drain) override;

 private:
  // A device tensor on its way: its message went into the inbox (without
  // the tensor) with its first chunk.
  struct ArrivingTensor {
    Message message;
    Shape shape;
    DType dtype = DType::kF32;
    std::deque<gpipe::v1::ShmSlot> chunks;  // checked, not yet copied
    bool complete = false;                  // no more chunks will come
  };

  // The reader thread: one checked descriptor.
  absl::StatusOr<std::optional<Message>> OnDescriptor(
      const ReceivedFrame& frame);
  bool WriteRelease(int64_t sequence);

  const PlaneContext& context_;
  const std::unique_ptr<CudaIpcChannel> channel_;
  FrameDataPlane* const frames_;

  absl::Mutex mu_;
  // In the order of their messages in the inbox.
  std::deque<std::shared_ptr<ArrivingTensor>> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);  // why no more chunks come
  std::shared_ptr<ArrivingTensor> arriving_;  // the reader thread's

  // The receiving stage's thread's, for the link's last log line.
  int64_t chunks_in_ = 0;
  double sender_wait_seconds_ = 0;  // for the sender's copies into the ring
  double copy_wait_seconds_ = 0;    // for copies out, when releasing inline
  // Null with GPIPE_CUDA_IPC_SYNC_RELEASE=1. Last: it stops (and its thread,
  // which writes releases on the control stream, ends) first.
  std::unique_ptr<OrderedReleaser> releaser_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_CUDA_IPC_DATA_PLANE_H_
