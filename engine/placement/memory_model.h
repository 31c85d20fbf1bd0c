#pragma once
// The byte formulas of the memory planner, one function per thing the engine allocates. Each
// says where in the engine the allocation is made; docs/placement.md writes them out.
// T = batch · cutoff_len tokens, P = T · top_k (token, expert) pairs, b = activation bytes.

#include <cstdint>
#include <string>

#include "engine/io/lora_target.h"
#include "engine/io/model_config.h"
#include "engine/placement/placement.h"

namespace tandem::placement::memory {

// Frozen weights of a dense (libtorch-side) module in `dense_bytes` per element.
int64_t moduleParameters(const io::ModelConfig& m, ModuleKind kind);

// Routed experts of one MoE layer: E · 3 · H · I weights in `format` (expert_format.h) with the
// scales the format carries (int8 per row, fp8 per 128×128 block, the blocks' own). For the
// format a GGUF file stores them in, layer `layer`'s bytes in the file (Q4_K_M mixes types).
uint64_t routedExpertBytes(const io::ModelConfig& m, const std::string& format, int layer = -1);
// One routed expert as a GPU holds it (model::StoredExpertWeights): the CPU engine's int8 with its
// row scales for weight format int8, its Tandem int4 tables for int4 (any group and symmetry),
// else the model dtype (bf16, or fp32).
uint64_t residentExpertBytes(const io::ModelConfig& m, const std::string& weight_format, bool bf16);
// The format a GPU holds and offload mode streams routed experts in for weight format
// `weight_format` (model::StoredExpertWeights): "int8", the int4 name as given ("int4:g64"), else
// the model dtype's ("bf16" / "fp32": fp8 and GGUF blocks reach the GPU dequantised).
std::string gpuExpertFormat(const std::string& weight_format, bool bf16);
// experts_mode auto's host copy of one MoE layer's experts, to stream from (model::
// StoredExpertWeights in gpuExpertFormat): one block per layer (gpu::carveHostBlock, pinned for
// exactly its bytes on a GPU machine) holding gate, up, down (and int8's three row-scale vectors),
// each from a multiple of 256 bytes.
uint64_t splitHostCopyBytes(const io::ModelConfig& m, const std::string& weight_format, bool bf16);

// LoRA parameters (A and B) a module gets from lora_target at rank r.
int64_t loraParameters(const io::ModelConfig& m, ModuleKind kind, int layer,
                       const io::LoraTarget& target, int rank);

// ExpertForwardCache of one MoE layer (engine/experts/expert_forward_cache.cpp chargeLedger):
// x [T, H] b + weights [P] f32 + gate, up [P, I] f32 + the LoRA products [nodes][P, 3r] f32 (r =
// lora_rank, 0 when LoRA targets none of the experts' projections) + routing offsets [E+1] and
// two [P] int64. nodes: the NUMA nodes the layer is split over (docs/experts.md).
uint64_t expertForwardCacheBytes(const io::ModelConfig& m, int64_t tokens, int64_t act_bytes,
                                 int lora_rank, int nodes = 1);

// The expert layer's largest scratch charge (expert_layer.cpp forward: out [nodes][P, H] f32;
// expert_layer_backward.cpp: dx_pairs [nodes][P, H] + hidden [P, I] when down is targeted +
// lora_t [nodes][P, r] per targeted projection + on several nodes their d w [nodes][P], all f32).
uint64_t expertScratchBytes(const io::ModelConfig& m, int64_t tokens, int rank,
                            int targeted_projections, bool down_targeted, int nodes = 1);

// Autograd activations one decoder layer keeps for its backward (libtorch side), in b bytes.
// mlp_chunk_tokens (0: none): the dense MLP runs in checkpointed chunks of that many tokens
// (gpu::GatedMlp::token_chunk, = moe_token_chunk), so its [tokens, intermediate] products are one
// chunk's; with shared_in_chunks the shared experts too (offload mode, where they run over the
// whole sequence; in cpu mode the MoE block's chunks each keep their shared experts' graph).
uint64_t layerActivationBytes(const io::ModelConfig& m, int layer, int64_t tokens,
                              int64_t act_bytes, int64_t mlp_chunk_tokens = 0,
                              bool shared_in_chunks = false);

// The chunked loss's transient: logits, their softmax and gradient for loss_chunk_tokens rows
// in f32 (engine/gpu/chunked_loss.cpp), plus the final hidden state and its gradient.
uint64_t lossActivationBytes(const io::ModelConfig& m, int64_t tokens, int64_t loss_chunk_tokens,
                             int64_t act_bytes);

// Tokens one MoE router / expert pass takes: moe_token_chunk (0 = auto, kAutoMoeTokenChunk of
// memory_planner.h), never more than the step's tokens.
int64_t moeChunkTokens(int64_t tokens, int64_t moe_token_chunk);

// One decoder layer's backward working set beyond the activations its recomputation saved
// (layerActivationBytes): the layer's output gradient and its input's, the attention kernel's
// gradients of q / k / v as the kernel sees them (GQA's K and V repeated to every query head by
// causalAttention, MLA's v padded to the q/k head dim) with the memory-efficient kernel's fp32
// dq accumulator, the repeated K/V copies and MLA's padded v and output themselves, the MLP's
// intermediate gradients, and per MoE token chunk the router's logits and their gradient in f32.
// No [S, S] term: the memory-efficient SDPA kernels never materialise the attention matrix.
// shared_in_chunks: as layerActivationBytes (the dense MLP's chunk is chunk_tokens).
uint64_t layerBackwardBytes(const io::ModelConfig& m, int layer, int64_t tokens,
                            int64_t chunk_tokens, int64_t act_bytes, bool shared_in_chunks = false);

// KV cache of one layer for `tokens` of context (GQA: K and V of the KV heads; MLA: the
// decompressed K and V of every head, as the engine's attention computes them).
uint64_t kvCacheBytes(const io::ModelConfig& m, int64_t tokens, int64_t act_bytes);

}  // namespace tandem::placement::memory
