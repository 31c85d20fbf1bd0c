// ExpertLayer::forward, per routed pair (t, j) with expert e (expert_layer.h has the math):
//   g = gate(x_t), u = up(x_t), h = silu(g) ⊙ u, o_{t,j} = down(h),  y_t = Σ_j w[t][j] · o_{t,j}
// in steps: check the call; sort the pairs by expert (routing); lease the outputs and, for
// training, the cache's block; compute o for every (expert, row-block) task on every node slice
// (forwardRows, or forwardColumns when the row tasks are too few or too unequal); sum each token's
// k pairs (and the nodes' parts) into y; keep what the backward needs in the cache.

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/core/busy_clock.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_layer_detail.h"

namespace tandem::experts {

void ExpertLayer::forward(const void* x, ActivationType act_type, int64_t n_tokens,
                          const int32_t* topk_ids, const float* topk_weights, int top_k, void* y,
                          ExpertForwardCache* cache) {
  checkForwardArguments(x, n_tokens, topk_ids, topk_weights, top_k, y);
  const ScopedBusyTime busy(BusyResource::ExpertEngine);  // the e2e bench's per-step trace
  packs_.ensurePacked();  // defer_packs and nothing released: every expert is the CPU's
  if (cache && cache->state_ == ExpertForwardCache::State::Cached) {
    throw Error("expert forward: the forward cache still holds activations nobody consumed",
                "run backward first, or release() the cache (activation recomputation)");
  }
  ExpertRouting routing = buildRouting(topk_ids, n_tokens, top_k, spec_.num_experts);
  // Background Wᵀ: a build this layer started for its successor in a backward that never reached
  // it (abandoned) is freed now; a training forward tells the next build what to pack.
  if (backward_successor_) backward_successor_->packs_.dropPrefetch();
  if (cache) packs_.recordRouted(routing);
  ForwardCall call = beginForward(x, act_type, routing);
  if (cache) {
    leaseCacheBlock(call, *cache,
                    static_cast<size_t>(n_tokens * spec_.hidden) * activationTypeBytes(act_type));
  }
  computeForward(call, cutIntoTasks(routing, row_block_), cache != nullptr);
  // y_t = Σ_j w[t][j] · o_{t,j}, o summed over the nodes.
  sumPerTokenOnNodes(routing, call.out_of_node, topk_weights, act_type, y);
  if (cache) keepForBackward(*cache, x, topk_weights, act_type, std::move(routing));
}

void ExpertLayer::checkForwardArguments(const void* x, int64_t n_tokens, const int32_t* topk_ids,
                                        const float* topk_weights, int top_k, const void* y) const {
  if (options_.lora_only) {
    throw Error(
        "expert forward: this layer only holds the expert LoRA (gpu-offload mode computes the "
        "experts on the GPU)");
  }
  if (n_tokens > 0 && (!x || !topk_ids || !topk_weights || !y)) {
    throw Error("expert forward: x, topk_ids, topk_weights and y must not be null");
  }
  validateRouting(topk_ids, n_tokens, top_k);
}

// out [nodes][P, H] leased (every row written by a task of its node) and one pass per slice
// over it; g, u and z stay unset (scratch per task) until a block is given for them.
ExpertLayer::ForwardCall ExpertLayer::beginForward(const void* x, ActivationType act_type,
                                                   const ExpertRouting& routing) const {
  const int64_t H = spec_.hidden, I = spec_.intermediate, n_pairs = routing.pairs();
  const auto n_nodes = static_cast<int64_t>(slices_.size());
  ForwardCall call;
  call.out = ExpertBufferPool::lease(static_cast<size_t>(n_nodes * n_pairs * H) * sizeof(float),
                                     MemoryCategory::Scratch);
  call.passes.resize(slices_.size());
  for (size_t s = 0; s < slices_.size(); ++s) {
    call.passes[s] = ForwardPass{&slices_[s],
                                 x,
                                 act_type,
                                 &routing,
                                 nullptr,
                                 nullptr,
                                 call.out.as<float>() + static_cast<int64_t>(s) * n_pairs * H};
    call.out_of_node.push_back(call.passes[s].out);
  }
  // g [P, I], u [P, I] (node-major: node k's [P, w_k] at P · i0_k) and the LoRA products
  // z [nodes][P, 3r], f32: the cache keeps them; the column split needs them between its phases.
  call.n_pairs = n_pairs;
  call.f32_bytes = static_cast<size_t>(n_pairs * (2 * I + n_nodes * loraZWidth())) * sizeof(float);
  return call;
}

// Points every pass's g, u and z at their parts of `gate`, a block of call.f32_bytes.
void ExpertLayer::useF32Block(ForwardCall& call, float* gate) const {
  const int64_t I = spec_.intermediate, n_pairs = call.n_pairs, zw = loraZWidth();
  float* up = gate + n_pairs * I;
  for (size_t s = 0; s < slices_.size(); ++s) {
    call.passes[s].gate = gate + n_pairs * slices_[s].i0;
    call.passes[s].up = up + n_pairs * slices_[s].i0;
    if (zw > 0) call.passes[s].lora_z = up + n_pairs * I + static_cast<int64_t>(s) * n_pairs * zw;
  }
}

// The cache's one block: the f32 buffers of beginForward, then x [T, H] in its own type.
void ExpertLayer::leaseCacheBlock(ForwardCall& call, ExpertForwardCache& cache,
                                  size_t x_bytes) const {
  const int64_t I = spec_.intermediate, n_pairs = call.n_pairs;
  cache.release();
  cache.block_ = ExpertBufferPool::lease(call.f32_bytes + x_bytes, MemoryCategory::Activations);
  cache.gate_ = cache.block_.as<float>();
  cache.up_ = cache.gate_ + n_pairs * I;
  cache.lora_z_ = loraZWidth() > 0 ? cache.up_ + n_pairs * I : nullptr;
  cache.x_ = cache.block_.as<unsigned char>() + call.f32_bytes;
  cache.x_bytes_ = x_bytes;
  useF32Block(call, cache.gate_);
}

// Every task on every node slice, each node by rows or by column blocks (its own choice); a
// column split without a cache leases g, u and z for the call.
void ExpertLayer::computeForward(ForwardCall& call, const std::vector<ExpertTask>& tasks,
                                 bool cached) const {
  std::vector<char> split(slices_.size());
  for (size_t s = 0; s < slices_.size(); ++s) split[s] = splitColumns(tasks, *slices_[s].pool);
  if (!cached && std::find(split.begin(), split.end(), 1) != split.end()) {
    call.split_block = ExpertBufferPool::lease(call.f32_bytes, MemoryCategory::Scratch);
    useF32Block(call, call.split_block.as<float>());
  }
  onEveryNode([&](size_t s) {
    const ForwardPass& pass = call.passes[s];
    if (split[s]) {
      forwardColumns(pass, tasks);
    } else {
      runTasks(*slices_[s].pool, tasks, [&](const ExpertTask& task) { forwardRows(pass, task); });
    }
  });
}

// One row block of one expert on one slice (I = the slice's width): o rows = the slice's part of
// down(silu(gate(x)) ⊙ up(x)), which is down's columns [i0, i1) times h's.
void ExpertLayer::forwardRows(const ForwardPass& pass, const ExpertTask& task) const {
  const NodeSlice& slice = *pass.slice;
  const int64_t H = spec_.hidden, I = slice.width(), m = task.end - task.begin;
  const int64_t r = std::max(lora_.rank(), 1), zw = kExpertProjCount * r;
  float* xe = detail::threadScratch(m * (H + 3 * I + zw));           // [m, H]
  float* g = pass.gate ? pass.gate + task.begin * I : xe + m * H;    // [m, I]
  float* u = pass.up ? pass.up + task.begin * I : xe + m * (H + I);  // [m, I]
  float* h = xe + m * (H + 2 * I);                                   // [m, I]
  // z [m, 3r]: s · x A_gateᵀ | s · x A_upᵀ | s · h A_downᵀ, kept in the cache when there is one.
  float* z = pass.lora_z ? pass.lora_z + task.begin * zw : xe + m * (H + 3 * I);
  detail::gatherRows(kernels_, pass.x, pass.act_type, *pass.routing, task.begin, task.end, H, xe);
  projectForward(ExpertProj::Gate, slice, task.expert, xe, m, g, z, zw);
  projectForward(ExpertProj::Up, slice, task.expert, xe, m, u, z + r, zw);
  kernels_.siluMul(m * I, g, u, h);
  projectForward(ExpertProj::Down, slice, task.expert, h, m, pass.out + task.begin * H, z + 2 * r,
                 zw);
}

// What the backward reads besides g, u and z (already in the cache's block): x, the routing
// weights and the routing itself; then the cache is Cached and charged.
void ExpertLayer::keepForBackward(ExpertForwardCache& cache, const void* x,
                                  const float* topk_weights, ActivationType act_type,
                                  ExpertRouting&& routing) const {
  // x into the cache in parallel chunks: 8 MB at 2048 tokens is milliseconds on one thread.
  constexpr size_t kChunk = size_t{1} << 20;
  const size_t x_bytes = cache.x_bytes_;
  const auto chunks = static_cast<int64_t>((x_bytes + kChunk - 1) / kChunk);
  pool_.parallelFor(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    const size_t begin = static_cast<size_t>(c0) * kChunk;
    const size_t end = std::min(x_bytes, static_cast<size_t>(c1) * kChunk);
    std::memcpy(cache.x_ + begin, static_cast<const unsigned char*>(x) + begin, end - begin);
  });
  cache.weights_.assign(topk_weights, topk_weights + routing.n_tokens * routing.top_k);
  cache.routing_ = std::move(routing);
  cache.act_type_ = act_type;
  cache.owner_ = this;
  cache.state_ = ExpertForwardCache::State::Cached;
  cache.chargeLedger();
}

}  // namespace tandem::experts
