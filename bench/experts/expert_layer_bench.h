#pragma once
// `tandem bench experts`, the engine half: synthetic expert layers of real models' shapes, routed
// uniformly or Zipf-skewed, timed forward + backward on each backend, with the machine ceilings
// measured in the same run. No libtorch here (its baseline is libtorch_expert_loop.h), so this
// half and its test build without it; experts_bench_command.cpp runs both and prints the JSON.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/experts/expert_types.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::bench {

struct BenchShape {
  std::string name;  // qwen3_30b, dsv2_lite, dsv3_32e
  int64_t num_experts = 0, top_k = 0, hidden = 0, intermediate = 0;
};
const std::vector<BenchShape>& benchShapes();
const BenchShape& benchShape(std::string_view name);  // throws Error naming the known shapes

enum class BenchRouting { Uniform, Zipf };
BenchRouting parseBenchRouting(std::string_view name);  // "uniform" | "zipf"; throws Error
std::string_view benchRoutingName(BenchRouting routing);

// One problem: frozen bf16 weights (and their fp8 block-scaled form, made on request), bf16
// activations, routing, expert LoRA of rank `lora_rank` on gate, up and down.
struct BenchProblem {
  BenchShape shape;
  int64_t tokens = 0;      // the layer's tokens
  int64_t resident = 0;    // experts on a GPU: the last ids, their slots masked
  int64_t cpu_tokens = 0;  // the rows below: tokens with a pair left (all of them: resident 0)
  BenchRouting routing = BenchRouting::Uniform;
  int lora_rank = 8;
  float lora_scale = 2.0f;
  std::vector<uint16_t> gate, up, down;    // [E, I, H], [E, I, H], [E, H, I] bf16 bits
  std::vector<uint8_t> gate8, up8, down8;  // fp8 e4m3 codes, same shapes
  std::vector<float> gate8_scale, up8_scale, down8_scale;  // [E, ceil(out/128), ceil(in/128)]
  std::vector<uint16_t> x, dy;                             // [cpu_tokens, H] bf16 bits
  std::vector<int32_t> ids;       // [cpu_tokens, top_k], kMaskedSlot: a resident expert's
  std::vector<float> weights;     // [cpu_tokens, top_k]
  int64_t activeExperts() const;  // experts with at least one routed token
  int64_t pairs() const;          // routed (token, slot) pairs, masked ones left out
};

// resident > 0: what co-computation with that many experts resident on a GPU hands the CPU
// engine (model/moe_function.h, CpuTokens): their slots masked, only the tokens with a pair left.
BenchProblem makeBenchProblem(const BenchShape& shape, int64_t tokens, BenchRouting routing,
                              uint64_t seed, ThreadPool& pool, int64_t resident = 0);
// Throws Error unless 0 <= resident < the shape's experts (what makeBenchProblem accepts).
void checkBenchResident(const BenchShape& shape, int64_t resident);
void addFp8Weights(BenchProblem& problem, ThreadPool& pool);  // fills gate8 ... down8_scale

struct BenchTiming {
  double fwd_ms = 0, bwd_ms = 0;
  // CPU time of the whole process over the same calls (0: not measured). On a shared machine it
  // moves much less than wall time with the other load, so it is what to compare there.
  double fwd_cpu_ms = 0, bwd_cpu_ms = 0;
};

// Work of one forward + backward (issue 7's definition): base GEMMs of the forward and of
// d hidden (2·3·H·I per routed pair each) plus the LoRA work; bytes: the routed experts' weights
// once in the forward and once in the backward (at `weight_bytes` per element) plus x, y, dy, dx.
double benchFlops(const BenchProblem& problem);
double benchBytes(const BenchProblem& problem, double weight_bytes);

struct BenchLayerConfig {
  std::string backend;  // as ExpertLayerOptions::backend
  // bf16 | int8 | fp8 (fp8: the block-scaled checkpoint, packed to bf16) | int4[:gN][:asym]
  // (quantised at creation) | a GGUF block type (q4_k, q8_0, ...: random tables, format blocks)
  std::string dtype;
  int numa_nodes = 0;  // as ExpertLayerOptions::numa_nodes (> 1: the layer runs on node pools)
  experts::TaskSplit task_split = experts::TaskSplit::Auto;
};
// The GGUF block type a bench dtype names ("q4_k" ...), nullopt for the others.
std::optional<experts::WeightType> benchBlockType(const std::string& dtype);

struct BenchLayerResult {
  BenchTiming timing;       // median over `repeats` after one warm-up
  double pack_ms = 0;       // layer creation: every pack, once
  double weight_bytes = 0;  // per element as packed
  std::string backend;      // resolved name
  std::string wt_policy;
  int numa_nodes = 1;  // resolved: the nodes the layer was split over
};
BenchLayerResult timeExpertLayer(const BenchProblem& problem, const BenchLayerConfig& config,
                                 int repeats, ThreadPool& pool);

// Ceilings measured in the run: TFLOP/s of our best bf16 kernel on a [n]² GEMM over the pool
// (the other half of peak_tflops_bf16 is oneDNN's, kernels::onednnSquareGemmTflops), and GB/s
// of a multi-threaded streaming read of `bytes`.
double ourSquareGemmTflops(int64_t n, ThreadPool& pool, int repeats);
double streamingReadGbytesPerS(uint64_t bytes, ThreadPool& pool, int repeats);

}  // namespace tandem::bench
