#include "engine/model/expert_streamer.h"

#include <c10/core/InferenceMode.h>

#include <utility>

#include "engine/core/error.h"

namespace tandem::model {

ExpertStreamer::ExpertStreamer(at::Device device, bool look_ahead)
    : device_(device), look_ahead_(look_ahead) {}

int ExpertStreamer::add(Source source) {
  const std::lock_guard lock(mutex_);
  sources_.push_back(std::move(source));
  return static_cast<int>(sources_.size()) - 1;
}

ExpertStreamer::Entry* ExpertStreamer::find(int index) {
  for (Entry& e : entries_) {
    if (e.index == index) return &e;
  }
  return nullptr;
}

bool ExpertStreamer::copyInto(int index, int keep) {
  Entry& e = entries_[0].index == keep ? entries_[1] : entries_[0];
  if (e.copy) e.copy->join();  // the block may go back to the allocator: its copy must be done
  e = Entry();
  // Normal tensors even when a chat (inference mode) copies them: a training step may use them.
  c10::InferenceMode not_inference(false);
  gpu::SideCopy copy(device_);
  std::optional<StoredExpertWeights> weights = sources_[static_cast<size_t>(index)](copy);
  if (!weights) return false;
  e.index = index;
  e.copy.emplace(std::move(copy));
  e.weights = std::move(*weights);
  return true;
}

int ExpertStreamer::guessNext(int index) {
  if (index == 0) {
    direction_ = 1;
  } else if (index == last_) {
    direction_ = -direction_;
  } else if (last_ >= 0) {
    direction_ = index > last_ ? 1 : -1;
  }
  const int next = index + direction_;
  // Generation runs forward passes back to back and no backward: the first layer follows the last.
  if (next == static_cast<int>(sources_.size()) && c10::InferenceMode::is_enabled()) return 0;
  return next;
}

void ExpertStreamer::start(int index) {
  const std::lock_guard lock(mutex_);
  if (!find(index)) copyInto(index, last_);
}

StoredExpertWeights ExpertStreamer::take(int index) {
  const std::lock_guard lock(mutex_);
  ++counts_.taken;
  Entry* entry = find(index);
  if (entry) {
    ++counts_.ready;
  } else {
    if (!copyInto(index, last_)) {
      throw Error("offload layer " + std::to_string(index) +
                      " was asked for its streamed experts before it chose them",
                  "this is a bug in Tandem; please report it");
    }
    entry = find(index);
  }
  entry->copy->join();
  StoredExpertWeights weights = entry->weights;
  const int next = guessNext(index);
  last_ = index;
  if (look_ahead_ && next >= 0 && next < static_cast<int>(sources_.size()) && !find(next) &&
      copyInto(next, index)) {
    ++counts_.copied_ahead;
  }
  return weights;
}

ExpertStreamer::Counts ExpertStreamer::counts() const {
  const std::lock_guard lock(mutex_);
  return counts_;
}

}  // namespace tandem::model
