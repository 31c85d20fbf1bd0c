#pragma once
// Offload mode's copies ahead of use (expert_offload.h): while the device computes one MoE
// layer, the link copies the next layer's streamed experts, so the copies overlap the compute
// instead of waiting for it (double buffering; DeepSpeed's ZeRO-3 prefetches its parameters the
// same way). One streamer per device, shared by the offload layers on it, registered in the
// order the forward runs them.
//
// The next layer is a guess from the layers served: the forward runs them first to last; a
// backward last to first (the checkpoint recomputations, or without checkpointing the weights
// each backward streams again); a layer served twice in a row (the last layer's recomputation
// right after its forward) turns the direction round, and layer 0 starts a forward; in inference
// mode (generation: forward passes only) layer 0 follows the last layer. A wrong
// guess costs a copy the link made for nothing; the layer then streams when it is asked for.
//
// At most two layers' experts are on the device: the layer served last (served again without a
// copy when it is asked for next, as at both turns) and the one on its way. Both are allocated
// on the device's current stream and their copies start after the work queued before them
// (side_copy.h), so no block is written while earlier work may read it; a copy never used is
// joined before its entry is dropped, so its block is not handed out while the copy may write.

#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "engine/gpu/side_copy.h"
#include "engine/model/stored_expert_weights.h"

namespace tandem::model {

class ExpertStreamer {
 public:
  // A layer's streamed experts copied to the streamer's device by `copy`, or nullopt while the
  // layer does not know them yet (offload mode's resident cache is chosen at its first call).
  using Source = std::function<std::optional<StoredExpertWeights>(gpu::SideCopy& copy)>;

  // look_ahead false: a layer's experts are copied when it asks for them (start()), the
  // baseline the look-ahead is measured against.
  ExpertStreamer(at::Device device, bool look_ahead);

  // Registers the next layer in forward order; returns its index for start() and take().
  int add(Source source);

  // Starts layer `index`'s copy now unless it is on the device or on its way (offload mode
  // calls it before computing its resident experts, which the copy then overlaps).
  void start(int index);
  // Layer `index`'s experts, usable by the work queued after this call on the current stream;
  // then starts the copy of the layer guessed to come next.
  StoredExpertWeights take(int index);

  struct Counts {
    int64_t taken = 0;         // take() calls
    int64_t ready = 0;         // of them, found on the device or on its way
    int64_t copied_ahead = 0;  // copies started for a guessed next layer
  };
  Counts counts() const;
  at::Device device() const { return device_; }

 private:
  struct Entry {
    int index = -1;  // -1: empty
    std::optional<gpu::SideCopy> copy;
    StoredExpertWeights weights;
  };
  Entry* find(int index);
  // Copies layer `index` into the entry not holding layer `keep` (joined and dropped first);
  // false when the layer does not know its experts yet.
  bool copyInto(int index, int keep);
  int guessNext(int index);

  at::Device device_;
  bool look_ahead_;
  std::vector<Source> sources_;
  std::array<Entry, 2> entries_;
  int last_ = -1;      // the layer served last
  int direction_ = 1;  // +1 forward order, -1 backward
  Counts counts_;
  mutable std::mutex mutex_;  // the forward and the autograd engine's thread both take
};

}  // namespace tandem::model
