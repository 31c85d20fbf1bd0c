#pragma once
// Shared by merged_export.cpp (HF output) and merged_export_gguf.cpp: the adapter read against
// the base and its per-module weight deltas. libtorch inside: include from engine/model .cpp only.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <string>

#include "engine/model/merged_export.h"
#include "engine/model/peft_adapter.h"

namespace tandem::model::merged_export {

struct AdapterDeltas {
  PeftAdapter adapter;
  double scale = 0;  // alpha / r (alpha / √r with rslora); per-pair rank differences are in B

  bool adapts(const std::string& module) const { return adapter.a.count(module) > 0; }
  // s·B·A [out, in] fp32 for an HF module name ("model.layers.0.self_attn.q_proj").
  at::Tensor delta(const std::string& module) const;
};

// Reads and validates the adapter against the base's config; refuses LoRA experts unless
// request.drop_lora_experts.
AdapterDeltas readAdapterDeltas(const MergedExportRequest& request);

// Progress and cancellation between tensors.
class ProgressTracker {
 public:
  ProgressTracker(const ExportProgressFn& fn, std::stop_token stop, int64_t total);
  void tensorDone(const std::string& name, uint64_t bytes);  // Error "cancelled" on stop
 private:
  const ExportProgressFn& fn_;
  std::stop_token stop_;
  ExportProgress progress_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Error unless all of the adapter's modules were merged (a LoRA with nowhere to go).
void requireAllMerged(const AdapterDeltas& deltas, int64_t merged,
                      const std::filesystem::path& base);

// The HF module a weight name belongs to: "x.q_proj.weight" -> "x.q_proj"; "" for other names.
std::string moduleOfWeight(const std::string& weight_name);

MergedExportResult writeMergedGguf(const MergedExportRequest& request, const AdapterDeltas& deltas,
                                   const ExportProgressFn& progress, std::stop_token stop);

}  // namespace tandem::model::merged_export
