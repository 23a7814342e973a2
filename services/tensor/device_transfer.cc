#include "services/tensor/device_transfer.h"

#include <cstring>

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
    // The staging buffer goes back to the pool: wait until it was read.
    copy_.Synchronize();
    return t;
  }

  Tensor ToHost(const Tensor& device) override {
    if (!device.defined() || device.device() == Device::kCpu) return device;
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

  cuda::Stream compute_, copy_;
  CachingAllocator cache_;
  CountingAllocator activations_;
  PinnedBufferPool pinned_;
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
