// The CUDA IPC plane: device tensors copied device to device through a
// buffer the upstream stage exported (cuda_ipc_channel.h). The Exchange
// stream carries a descriptor per chunk and a CUDA_IPC_RELEASE per chunk
// back; messages without a tensor stay in frames. The reader thread checks
// descriptors; the receiving stage's thread copies the tensor out in
// ReceiveTensor, chunk by chunk as they arrive, releasing each, so that a
// tensor larger than the ring flows through it.
#ifndef GPIPE_SERVICES_TRANSPORT_CUDA_IPC_DATA_PLANE_H_
#define GPIPE_SERVICES_TRANSPORT_CUDA_IPC_DATA_PLANE_H_

#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/transport/cuda_ipc_channel.h"
#include "services/transport/frame_data_plane.h"
#include "services/transport/plane.h"

namespace gpipe {

class CudaIpcDataPlane final : public DataPlane {
 public:
  // `frames` carries the messages without a tensor; it outlives the plane.
  CudaIpcDataPlane(const PlaneContext& context,
                   std::unique_ptr<CudaIpcChannel> channel,
                   FrameDataPlane* frames)
      : context_(context), channel_(std::move(channel)), frames_(frames) {}

  DataPlaneKind kind() const override { return DataPlaneKind::kCudaIpc; }
  bool CarriesDeviceTensors() const override { return true; }
  absl::Status Send(const Message& m) override;
  absl::StatusOr<std::optional<Message>> OnFrame(
      const ReceivedFrame& frame) override;
  absl::Status ReceiveTensor(Message& m) override;
  void Close(const absl::Status& why) override;

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
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_CUDA_IPC_DATA_PLANE_H_
