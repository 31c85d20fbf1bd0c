#pragma once
// Named LoRA adapters kept beside one base Model, unmerged, and switched between requests.
// Switching re-points each LoRA-capable linear at the chosen adapter's A/B tensors (no copy) and
// swaps the routed experts' LoRA buffers in and out of the expert engine, so any number of
// adapters share the one base and a switch costs a walk over the modules.
// A merged adapter is folded into the dense weights for good (W += s·B·A, PEFT's merge); the
// routed experts keep it as LoRA in the expert kernel, because a merged copy of every expert
// would double the largest part of the model for a rank-r saving.

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::model {

class Model;

// How an adapter is applied. Unmerged adapters are switched per request. A merged adapter is
// folded into the base's dense weights (W += s·B·A) once, for speed; the routed experts keep it
// as LoRA in the expert kernel (a merged copy of every expert would double the largest part of
// the model). A merged adapter must be the only adapter, and the bare base is gone afterwards.
enum class AdapterMode { Unmerged, Merged };

class AdapterSet {
 public:
  explicit AdapterSet(Model& model);
  ~AdapterSet();
  AdapterSet(const AdapterSet&) = delete;
  AdapterSet& operator=(const AdapterSet&) = delete;

  void add(const std::string& name, const std::filesystem::path& dir, AdapterMode mode);
  // "" or "base": no adapter. Throws tandem::Error for an unknown name, or for the base after a
  // merge. A no-op when `name` is already active.
  void activate(std::string_view name);
  const std::string& active() const { return active_; }  // "" for the base

  std::vector<std::string> names() const;
  bool has(std::string_view name) const;
  bool merged() const { return merged_; }

 private:
  struct Adapter;
  Adapter* find(std::string_view name);
  void swapIn(Adapter& adapter);   // attach its LoRA; experts' buffers swapped into the engine
  void swapOut(Adapter& adapter);  // detach; experts' buffers swapped back into `adapter`

  Model& model_;
  std::vector<std::unique_ptr<Adapter>> adapters_;
  std::string active_;
  bool merged_ = false;
};

}  // namespace tandem::model
