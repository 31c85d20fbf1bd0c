#pragma once
// Gradient checkpoints in host memory (ModelOptions::offload_checkpoints): the input [B, S, H] of
// every checkpointed layer is copied to host memory when the forward reaches the layer, and
// copied back one layer ahead during the backward, so the device holds no checkpoint besides the
// one in use and the one on its way, however deep the model (torch's
// autograd.graph.save_on_cpu, and Unsloth's offloaded checkpointing, do the same for
// transformers).
//
// On a CUDA device both copies run on a side stream (one per device, in issue order, so a copy
// back never overtakes the copy out): the copy out overlaps the layer's own forward, the copy
// back the backward of the layer after it. The host copies are pinned. On any other device the
// same code runs with plain host copies (the CPU tests exercise it).
//
// The host bytes are charged to the memory ledger as ("cpu", Activations) while they are held.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/gpu/checkpoint_offload_bytes.h"

namespace tandem::gpu {

class CheckpointOffload {
 public:
  CheckpointOffload();
  ~CheckpointOffload();
  CheckpointOffload(const CheckpointOffload&) = delete;
  CheckpointOffload& operator=(const CheckpointOffload&) = delete;

  // Starts copying x (a layer's input, on its device) to host memory; returns the slot take()
  // gives it back by. Slots are numbered in forward order from 0. The copy starts after the work
  // queued so far on the device's current stream, and x's device memory is not reused before it
  // finished (the caller may drop x at once).
  int64_t store(const at::Tensor& x);
  // Starts the copy of slot `slot` back to its device, unless it is already there or on its way,
  // or was taken, or does not exist (the first layer asks for slot -1): a backward asks for the
  // layer before the one it runs.
  void prefetch(int64_t slot);
  // Slot `slot`'s tensor on its device, bitwise as stored, usable by the work queued after this
  // call on the current stream (copied now when no prefetch started it); the slot's host copy is
  // released. Taking a slot twice is an Error (a graph's backward ran twice).
  at::Tensor take(int64_t slot);

  int64_t slots() const;
  uint64_t hostBytes() const;  // the host copies held now
  // For tests: slot `slot`'s host copy (shares its storage; undefined once taken).
  at::Tensor hostCopy(int64_t slot) const;

 private:
  struct Slot;
  struct Streams;
  Slot& slotAt(int64_t slot) const;  // Errors on a slot that does not exist
  void startCopyBack(Slot& s);       // under mutex_

  mutable std::mutex mutex_;  // the backward of layers on two GPUs runs on two threads
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<Streams> streams_;  // CUDA side streams, per device index
};

}  // namespace tandem::gpu
