#pragma once
// Plain value types shared by the expert engine's public API and its kernels. No libtorch here:
// the MoE autograd node (engine/gpu) hands raw pointers to ExpertLayer.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::experts {

// Shape of one routed-experts block (HF names: num_experts, hidden_size, moe_intermediate_size).
struct ExpertLayerSpec {
  int64_t num_experts = 0;
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
};

// PEFT LoRA on the experts' projections. scale is applied as given (alpha / r, or
// alpha / sqrt(r) for rsLoRA: the caller decides).
struct ExpertLoraSpec {
  int rank = 0;
  float scale = 0.0f;
  bool gate = false, up = false, down = false;

  bool any() const { return rank > 0 && (gate || up || down); }
};

// Activations crossing the API: x, y, dy, dx. BF16 is raw uint16 bits.
enum class ActivationType { F32, BF16 };
// Frozen base weights as stored in the checkpoint (raw bits for BF16 / F16 / FP8).
// FP8_E4M3 comes with 128 × 128 block scales (DeepSeek-V3's weight_scale_inv), see below.
// The rest are tables of blocks along the input dimension (expert_blocks.h): ggml's block types
// as a GGUF file stores them (Q8_0 … MXFP4, the structs of engine/core/ggml_blocks.h), and Tandem's
// INT4 (groups of Int4Spec::group, quantised at load: WeightFormat::Int4).
enum class WeightType {
  F32,
  BF16,
  F16,
  FP8_E4M3,
  Q8_0,
  Q4_0,
  Q4_K,
  Q5_K,
  Q6_K,
  IQ4_XS,
  MXFP4,
  INT4
};

// Tandem int4: one f16 scale d (and, asymmetric, an f16 offset m) per `group` consecutive inputs
// of a row; w = d · (q − 8) symmetric, w = d · q + m asymmetric, q in [0, 15].
struct Int4Spec {
  int group = 32;  // 32, 64 or 128
  bool symmetric = true;
};

// What the frozen experts are packed to and multiplied in (chosen per layer, at creation):
//   Bf16: bf16 (the fp32 backends `generic` / `avx512` read F32/BF16/F16 zero-copy instead);
//   Int8: per-output-channel symmetric int8, quantised at load (activations per row at run time).
// FP8 checkpoints are dequantised (value × block scale) at pack time to either of them: no CPU
// here multiplies fp8 natively, and the packed format is what the kernels stream.
//   Int4: Tandem int4 blocks (Int4Spec), quantised at layer creation from any element type;
//   Blocks: the views' block tables as they are (a GGUF file's Q4_K …, zero-copy), multiplied on
//     their blocks; forward and backward read the same table (no transposed copy).
// Block views in Bf16 / Int8 are dequantised at pack time like fp8.
enum class WeightFormat { Bf16, Int8, Int4, Blocks };

// The backward pass multiplies by Wᵀ. Persistent: a second pack of Wᵀ made at creation (twice
// the weight memory, no per-step cost). OnDemand: the Wᵀ packs of the experts a batch routes to
// are rebuilt at the start of each backward and freed at its end (weight memory once, a repack
// per step). The memory planner chooses; ExpertLayer reports it (docs/experts.md).
// Background: as OnDemand, but built ahead: when the backward of the MoE layer after this one
// finishes, this layer's Wᵀ packs for the experts its last training forward routed to are built
// on the pool while the GPU runs that layer's attention backward (ExpertLayer::
// setBackwardSuccessor links the layers). Memory as OnDemand's: one layer's packs at a time,
// plus the next one's while it is built.
enum class WtPolicy { Persistent, OnDemand, Background };

// How a call cuts its work into pool tasks (docs/experts.md, "Scheduling"):
//   Rows: (expert, row-block) tasks, each computing whole output rows;
//   Columns: (expert, row-block, column-block) tasks in two phases (gate/up over slices of I,
//     then down over slices of H; the backward the same way round), bitwise the same results;
//   Auto: Columns when the row-block tasks are too few or too unequal for the pool, else Rows.
enum class TaskSplit { Auto, Rows, Columns };

std::string_view activationTypeName(ActivationType type);
std::string_view weightTypeName(WeightType type);
std::string_view weightFormatName(WeightFormat format);
std::string_view wtPolicyName(WtPolicy policy);
// "bf16" | "int8" | "int4" | "blocks"; throws Error. int4 may carry its group and symmetry as
// "int4:g64", "int4:asym", "int4:g128:asym" (what experts_format, experts_int4_group and
// experts_int4_symmetric compose; default group 32, symmetric), written to *int4 when given.
WeightFormat parseWeightFormat(std::string_view name, Int4Spec* int4 = nullptr);
// The composed name of int4 with `spec` ("int4", "int4:g64:asym").
std::string int4FormatName(const Int4Spec& spec);
WtPolicy parseWtPolicy(std::string_view name);  // "persistent" | "on_demand" | "background"; throws
std::string_view taskSplitName(TaskSplit split);
TaskSplit parseTaskSplit(std::string_view name);  // "auto" | "rows" | "columns"; throws Error
int64_t activationTypeBytes(ActivationType type);
// Of one element (FP8: 1, scales not counted); 0 for the block types (expert_blocks.h sizes them).
int64_t weightTypeBytes(WeightType type);

// The three projections of a SiLU-gated expert; the order indexes per-projection arrays.
enum class ExpertProj { Gate = 0, Up = 1, Down = 2 };
inline constexpr int kExpertProjCount = 3;
std::string_view expertProjName(ExpertProj proj);

// Per-expert views of the frozen weights, e.g. into memory-mapped safetensors. Pointers need
// only be aligned to their element size's smallest unit (2 bytes); experts need not be adjacent.
//   gate[e], up[e]: [I, H] row-major;  down[e]: [H, I] row-major.
// FP8_E4M3 only: *_scale[e] [ceil(out / 128), ceil(in / 128)] f32 row-major, the checkpoint's
// weight_scale_inv: W[o][i] = fp8(o, i) · scale[o / 128][i / 128].
// Block types only: each view is the table of `out` rows of in / block_elems blocks, and
// *_bytes[e] says how long the table the view points into is (a GGUF tensor's bytes): the layer
// checks it against the shape before reading a block (expert_blocks.h: checkBlockTable).
struct ExpertWeightViews {
  WeightType type = WeightType::BF16;
  std::vector<const void*> gate, up, down;
  std::vector<const float*> gate_scale, up_scale, down_scale;
  std::vector<uint64_t> gate_bytes, up_bytes, down_bytes;
  Int4Spec int4;  // INT4: the tables'; other types under experts_format int4: the spec to make
  // Block types only: a projection stored in another block type than `type` (a GGUF file mixes
  // them: Q4_K_M keeps some down_proj tensors in Q6_K). Empty: all three are `type`.
  std::vector<WeightType> proj_types;  // [kExpertProjCount] when set

  WeightType typeOf(ExpertProj proj) const {
    return proj_types.empty() ? type : proj_types[static_cast<size_t>(proj)];
  }
};
inline constexpr int64_t kFp8BlockSize = 128;

}  // namespace tandem::experts
