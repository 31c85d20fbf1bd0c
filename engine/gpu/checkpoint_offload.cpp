#include "engine/gpu/checkpoint_offload.h"

#include <ATen/ATen.h>

#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/memory_ledger.h"

#ifdef TANDEM_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tandem::gpu {

namespace {
std::atomic<uint64_t> bytes_offloaded{0};
}  // namespace

uint64_t checkpointBytesOffloaded() { return bytes_offloaded.load(); }

struct CheckpointOffload::Slot {
  at::Device device = at::kCPU;
  at::Tensor host;       // [B, S, H] on the host; undefined once taken
  at::Tensor on_device;  // the copy back, once prefetch (or take) started it
  bool taken = false;
  MemoryCharge charge;  // host: ("cpu", Activations)
#ifdef TANDEM_WITH_CUDA
  std::optional<at::cuda::CUDAEvent> arrived;  // recorded on the side stream after the copy back
#endif
};

struct CheckpointOffload::Streams {
#ifdef TANDEM_WITH_CUDA
  std::map<c10::DeviceIndex, c10::cuda::CUDAStream> side;

  c10::cuda::CUDAStream of(at::Device device) {
    auto it = side.find(device.index());
    if (it == side.end()) {
      it = side.emplace(device.index(),
                        c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index()))
               .first;
    }
    return it->second;
  }

  // The side stream waits for the work queued so far on the device's current stream: the tensor
  // copied out is made by it, and a block the copy back writes may still be read by it.
  c10::cuda::CUDAStream after_current(at::Device device) {
    const c10::cuda::CUDAStream stream = of(device);
    at::cuda::CUDAEvent queued;
    queued.record(c10::cuda::getCurrentCUDAStream(device.index()));
    queued.block(stream);
    return stream;
  }
#endif
};

CheckpointOffload::CheckpointOffload() : streams_(std::make_unique<Streams>()) {}
CheckpointOffload::~CheckpointOffload() = default;

int64_t CheckpointOffload::store(const at::Tensor& x) {
  auto slot = std::make_unique<Slot>();
  slot->device = x.device();
  slot->host = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(x.is_cuda()));
  slot->charge =
      MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Activations, slot->host.nbytes());
  const std::lock_guard lock(mutex_);
#ifdef TANDEM_WITH_CUDA
  if (x.is_cuda()) {
    const c10::cuda::CUDAGuard guard(x.device());
    const c10::cuda::CUDAStream side = streams_->after_current(x.device());
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      slot->host.copy_(x, /*non_blocking=*/true);
    }
    // The caller drops x now; its block must not be handed out before the side stream read it.
    c10::cuda::CUDACachingAllocator::recordStream(x.storage().data_ptr(), side);
  } else {
    slot->host.copy_(x);
  }
#else
  slot->host.copy_(x);  // a copy even on the CPU device: the layer's input is then released
#endif
  bytes_offloaded.fetch_add(slot->host.nbytes());
  slots_.push_back(std::move(slot));
  return static_cast<int64_t>(slots_.size()) - 1;
}

CheckpointOffload::Slot& CheckpointOffload::slotAt(int64_t slot) const {
  if (slot < 0 || slot >= static_cast<int64_t>(slots_.size())) {
    throw Error("checkpoint offload: no slot " + std::to_string(slot) + " (" +
                std::to_string(slots_.size()) + " stored)");
  }
  return *slots_[static_cast<size_t>(slot)];
}

void CheckpointOffload::startCopyBack(Slot& s) {
  if (s.taken || s.on_device.defined()) return;
#ifdef TANDEM_WITH_CUDA
  if (s.device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(s.device);
    // Allocated on the current stream, which uses it; written on the side stream after the copy
    // out (same stream, issue order) and after the current stream's queued work.
    s.on_device = at::empty(s.host.sizes(), s.host.options().device(s.device).pinned_memory(false));
    const c10::cuda::CUDAStream side = streams_->after_current(s.device);
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      s.on_device.copy_(s.host, /*non_blocking=*/true);
    }
    s.arrived.emplace();
    s.arrived->record(side);
    return;
  }
#endif
  // The host is the device: the stored copy itself, bitwise.
  s.on_device = s.device.is_cpu() ? s.host : s.host.to(s.device);
}

void CheckpointOffload::prefetch(int64_t slot) {
  const std::lock_guard lock(mutex_);
  if (slot < 0 || slot >= static_cast<int64_t>(slots_.size())) return;
  startCopyBack(*slots_[static_cast<size_t>(slot)]);
}

at::Tensor CheckpointOffload::take(int64_t slot) {
  const std::lock_guard lock(mutex_);
  Slot& s = slotAt(slot);
  if (s.taken) {
    throw Error("checkpoint offload: slot " + std::to_string(slot) + " was already taken",
                "a graph with offloaded checkpoints runs its backward once");
  }
  startCopyBack(s);
#ifdef TANDEM_WITH_CUDA
  if (s.arrived) {
    const c10::cuda::CUDAGuard guard(s.device);
    s.arrived->block(c10::cuda::getCurrentCUDAStream(s.device.index()));
    s.arrived.reset();
  }
#endif
  // The pinned host allocator keeps the block until the copy back that reads it finished.
  at::Tensor out = std::exchange(s.on_device, at::Tensor());
  s.host = at::Tensor();
  s.charge.reset();
  s.taken = true;
  return out;
}

int64_t CheckpointOffload::slots() const {
  const std::lock_guard lock(mutex_);
  return static_cast<int64_t>(slots_.size());
}

uint64_t CheckpointOffload::hostBytes() const {
  const std::lock_guard lock(mutex_);
  uint64_t total = 0;
  for (const auto& s : slots_) total += s->charge.bytes();
  return total;
}

at::Tensor CheckpointOffload::hostCopy(int64_t slot) const {
  const std::lock_guard lock(mutex_);
  return slotAt(slot).host;
}

}  // namespace tandem::gpu
