#include "services/tensor/device_transfer.h"

#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "services/tensor/caching_allocator.h"
#include "services/tensor/device.h"
#include "services/tensor/fake_device.h"
#include "services/tensor/pinned_pool.h"

#if GPIPE_HAVE_CUDA
#include "services/tensor/cuda/runtime.h"
#endif

namespace gpipe {

DeviceTransfer::Scope::Scope(DeviceTransfer* t) : t_(t) {
  if (t_ == nullptr) return;
  allocator_ = std::make_unique<AllocatorScope>(&t_->activations());
  t_->Enter();
}

DeviceTransfer::Scope::~Scope() {
  if (t_ != nullptr) t_->Leave();
}

namespace {

// The fake device's side (fake_device.h): its own cached arena blocks,
// copies on the calling thread, no streams.
class FakeTransfer final : public DeviceTransfer {
 public:
  FakeTransfer() : cache_(FakeDeviceMemory()), activations_(&cache_) {}

  Tensor ToDevice(const Tensor& host) override {
    if (!host.defined() || host.device() == Device::kCuda) return host;
    return host.To(Device::kCuda);
  }
  Tensor ToHost(const Tensor& device) override {
    if (!device.defined() || device.device() == Device::kCpu) return device;
    return device.To(Device::kCpu);
  }
  CountingAllocator& activations() override { return activations_; }

 private:
  void Enter() override {}
  void Leave() override {}

  CachingAllocator cache_;
  CountingAllocator activations_;
};

}  // namespace

#if GPIPE_HAVE_CUDA
namespace {

class CudaTransfer final : public DeviceTransfer {
 public:
  CudaTransfer() : cache_(CudaDeviceMemory()), activations_(&cache_) {}

  Tensor ToDevice(const Tensor& host) override {
    if (!host.defined() || host.device() == Device::kCuda) return host;
    Reclaim();
    Tensor t = Tensor::Empty(host.shape(), host.dtype(), Device::kCuda);
    PinnedBufferPool::Buffer staging = pinned_.Acquire(host.nbytes());
    std::memcpy(staging.data(), host.raw(), host.nbytes());
    // `t`'s block comes from the compute stream's cache: a tensor freed on
    // the host may still be read by kernels queued there (the saved input
    // of a micro-batch whose weight-gradient GEMM has not run yet). The copy
    // waits for them; the cost is that this copy no longer overlaps compute
    // queued before it (the staging memcpy above still does).
    cuda::StreamWaitStream(copy_.handle(), compute_.handle());
    cuda::CopyHostToDeviceAsync(t.raw(), staging.data(), host.nbytes(),
                                copy_.handle());
    cuda::StreamWaitStream(compute_.handle(), copy_.handle());
    // The staging buffer goes back to the pool once the copy has read it.
    // Waiting for that here would wait for all the compute queued before
    // the copy, and the stage would lose its lead over its stream at every
    // received tensor; the buffer is parked with an event instead.
    Park(std::move(staging));
    return t;
  }

  ~CudaTransfer() override {
    // Parked buffers return to the pool (declared before them) only after
    // the copies that read them.
    copy_.Synchronize();
  }

  Tensor ToHost(const Tensor& device) override {
    if (!device.defined() || device.device() == Device::kCpu) return device;
    Reclaim();
    cuda::StreamWaitStream(copy_.handle(), compute_.handle());
    PinnedBufferPool::Buffer staging = pinned_.Acquire(device.nbytes());
    cuda::CopyDeviceToHostAsync(staging.data(), device.raw(), device.nbytes(),
                                copy_.handle());
    Tensor host = Tensor::Empty(device.shape(), device.dtype(), Device::kCpu);
    copy_.Synchronize();
    std::memcpy(host.raw(), staging.data(), device.nbytes());
    return host;
  }

  CountingAllocator& activations() override { return activations_; }

 private:
  void Enter() override {
    stream_scope_ = std::make_unique<cuda::StreamScope>(compute_);
  }
  void Leave() override { stream_scope_.reset(); }

  // A staging buffer whose copy to the device may still be reading it.
  struct Parked {
    PinnedBufferPool::Buffer staging;
    std::unique_ptr<cuda::Event> copied;
  };
  // More parked buffers than this means the host runs far ahead of the
  // copy stream: the oldest is then waited for, bounding pinned memory.
  static constexpr size_t kMaxParked = 64;

  void Park(PinnedBufferPool::Buffer staging) {
    std::unique_ptr<cuda::Event> e;
    if (!spare_events_.empty()) {
      e = std::move(spare_events_.back());
      spare_events_.pop_back();
    } else {
      e = std::make_unique<cuda::Event>();
    }
    e->Record(copy_.handle());
    parked_.push_back({std::move(staging), std::move(e)});
    if (parked_.size() > kMaxParked) {
      parked_.front().copied->Synchronize();
      Reclaim();
    }
  }

  // Copies on the copy stream finish in order: the oldest first.
  void Reclaim() {
    while (!parked_.empty() && parked_.front().copied->Done()) {
      spare_events_.push_back(std::move(parked_.front().copied));
      parked_.pop_front();
    }
  }

  cuda::Stream compute_, copy_;
  CachingAllocator cache_;
  CountingAllocator activations_;
  PinnedBufferPool pinned_;
  std::deque<Parked> parked_;  // after pinned_: returned to it first
  std::vector<std::unique_ptr<cuda::Event>> spare_events_;
  std::unique_ptr<cuda::StreamScope> stream_scope_;
};

}  // namespace
#endif

std::unique_ptr<DeviceTransfer> DeviceTransfer::Create() {
  if (FakeDeviceEnabled()) return std::make_unique<FakeTransfer>();
#if GPIPE_HAVE_CUDA
  if (CudaAvailable()) return std::make_unique<CudaTransfer>();
#endif
  return nullptr;
}

}  // namespace gpipe
