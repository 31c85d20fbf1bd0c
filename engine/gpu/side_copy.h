#pragma once
// Host → device copies that overlap the device's compute: on a CUDA device they run on a side
// stream, so the work queued on the current stream after them (another expert group's products)
// runs while the copy engine moves the bytes; join() makes the current stream wait for them
// before their first use. The host never waits. On any other device (or without CUDA) they are
// plain copies and join() does nothing.
//
// The side stream starts after the work already queued on the current stream: the copies'
// destinations come from the caching allocator in the current stream's order, and blocks it
// hands out may still be read by that earlier work.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <optional>

namespace tandem::gpu {

class SideCopy {
 public:
  explicit SideCopy(at::Device device);

  // dst (on the device, allocated on the current stream) <- src (host; pinned for an
  // asynchronous copy), complete after join().
  void copy(const at::Tensor& dst, const at::Tensor& src);
  // The current stream waits (on the device) for every copy made so far.
  void join();

  at::Device device() const { return device_; }

 private:
  at::Device device_;
  std::optional<c10::Stream> current_, side_;  // CUDA only
};

}  // namespace tandem::gpu
