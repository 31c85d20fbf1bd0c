#pragma once
// The per-expert split of one MoE layer for one pass (forward or backward), decided once the
// layer's routing is known: which experts the GPU computes from its resident copies, which it
// computes after streaming them this step over the copy engine, and which stay on the CPU expert
// engine, so that the CPU and the GPU side finish together (issue 28). The MoE block's split code
// calls splitLayer per layer per step; the costs come from the cost model (step_cost.h:
// layerCosts), which built them from the calibrated MachineRates.
//
// The rule: resident experts are the GPU's whatever it costs (their weights are there already).
// Of the others, the most routed move to the GPU first (an expert's copy costs the same bytes
// whatever its tokens, so the hottest saves the CPU the most time per byte streamed), one at a
// time, while that lowers the layer's finish time max(CPU, GPU compute, copy engine). It stops at
// the first move that would not: then the CPU and the GPU side finish within one expert's cost of
// each other. Experts no token routes to cost nothing and stay with the CPU (nothing runs).
// On a machine without a GPU (costs.has_gpu false) everything stays on the CPU.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/placement/machine_rates.h"

namespace tandem::placement {

// Which passes of a layer one split decision covers. The cost model decides per pass; the model's
// auto mode decides once per call and keeps that split for the call's backward (its streamed
// experts are copied again there), so a call that builds a graph is priced forward + backward.
enum class LayerPass { Forward, Backward, ForwardAndBackward };

// What one expert costs on each resource in one pass of one layer, and what else the layer keeps
// the resources busy with while its experts run. Milliseconds throughout.
struct LayerCosts {
  int64_t hidden = 0;                   // H
  int64_t intermediate = 0;             // I, of one routed expert
  LayerPass pass = LayerPass::Forward;  // which side of the rate curves (both: their sum)
  RateCurve cpu;                        // the CPU expert engine
  // The engine's fixed cost per call (once per pass), paid when any expert stays on the CPU.
  double cpu_call_ms = 0;
  bool has_gpu = false;     // false: the GPU terms below are absent
  RateCurve gpu_gemm;       // the GPU's expert products
  double expert_bytes = 0;  // one expert's weights as streamed (its format)
  double host_to_device_bytes_per_s = 0;
  // Beyond the products, per expert and pass on the GPU (GpuRates' fitted terms): its grouping,
  // elementwise products and launches, and the cast of int8 / int4 weights to bf16.
  double gpu_expert_overhead_ms = 0;
  double streamed_expert_ms = 0;  // a streamed expert's device-side staging, per copy
  double split_cpu_call_ms = 0;   // the split's CPU call beside the GPU's, per pass
  double cpu_base_ms = 0;         // other CPU work beside the experts
  double gpu_base_ms = 0;         // other GPU work beside the experts (the shared experts)
  // Copy time available before the experts start (the streamed set chosen ahead from routing
  // statistics can be copied during the layer's attention); 0 when chosen after routing.
  double copy_head_start_ms = 0;

  double cpuMs(int64_t tokens) const;  // one expert computing `tokens` tokens on the CPU
  double gpuMs(int64_t tokens) const;  // the same on the GPU (its weights there)
  double copyMs() const;               // one expert's weights host → device (once per pass)
  double streamedGpuMs() const;        // the GPU's staging of one streamed expert (per pass)
};

// The expert shape and format LayerCosts are built for.
struct ExpertCostShape {
  int64_t hidden = 0;           // H
  int64_t intermediate = 0;     // I
  double expert_bytes = 0;      // one expert's weights as streamed
  std::string format = "bf16";  // the CPU engine's rate curve (MachineRates::cpuFor)
  int gpu = 0;                  // the device's rates (MachineRates::gpu); -1: no GPU terms
};

// One MoE layer's costs for `pass` from the machine's rates (base work and head start zero):
// what the cost model (step_cost.h) and the model's auto split (engine/model/expert_split.h) both
// price experts with. Without the GPU's rates has_gpu is false (everything stays on the CPU).
LayerCosts expertLayerCosts(const MachineRates& rates, const ExpertCostShape& shape,
                            LayerPass pass);

struct ExpertSplit {
  std::vector<int64_t> resident;  // computed on the GPU from its resident copies (ids)
  std::vector<int64_t> streamed;  // copied this pass, then computed on the GPU, hottest first
  std::vector<int64_t> cpu;       // the CPU expert engine's (with those routed no tokens)
  double cpu_ms = 0;              // busy time of each resource in this pass, base work included
  double gpu_ms = 0;
  double copy_ms = 0;  // after the head start

  double finishMs() const;  // max of the three: the layer's experts are done
};

// tokens_per_expert [E] (this pass's routing: pairs per expert); resident: ids in [0, E) the GPU
// holds (empty without a GPU). Throws tandem::Error on an id out of range, a negative count, or
// resident experts without a GPU.
ExpertSplit splitLayer(const LayerCosts& costs, std::span<const int64_t> tokens_per_expert,
                       std::span<const int64_t> resident);

}  // namespace tandem::placement
