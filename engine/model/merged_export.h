#pragma once
// A LoRA adapter merged into its base model's weights, written for deployment
// (docs/export.md): a Hugging Face folder (config, tokenizer files, safetensors) or a GGUF file
// that llama.cpp loads (f16, q8_0 or llama.cpp's q4_k_m mix). Merging is PEFT's
// merge_and_unload: W' = W + s·B·A with s = alpha / r (alpha / √r with use_rslora), in fp32,
// then stored in the output's type. Attention, dense and routed-expert LoRA merge; LoRA
// Experts (lora_experts.h) are extra modules, not a weight delta: refused unless dropped.
// No libtorch in this header.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <stop_token>
#include <string>

namespace tandem::model {

enum class ExportFormat { Hf, Gguf };
// The GGUF weights' types: F16 (2-D weights f16, the rest f32), Q8_0 (2-D weights q8_0), Q4_K_M
// (llama.cpp's mix: Q4_K, with Q6_K for output.weight and for attn_v / ffn_down on the layers
// llama.cpp's use_more_bits picks). The router (ffn_gate_inp) and 1-D tensors stay f32.
enum class GgufQuant { F16, Q8_0, Q4_K_M };

ExportFormat parseExportFormat(const std::string& text);  // "hf" | "gguf"; Error otherwise
GgufQuant parseGgufQuant(const std::string& text);        // "f16" | "q8_0" | "q4_k_m"
std::string ggufQuantName(GgufQuant quant);               // "f16", "q8_0", "q4_k_m"

struct MergedExportRequest {
  std::filesystem::path adapter;  // a PEFT adapter dir
  std::filesystem::path base;     // HF model dir, or a GGUF model (.gguf)
  std::filesystem::path out_dir;  // filled with the export; the caller makes it (empty)
  ExportFormat format = ExportFormat::Hf;
  GgufQuant quant = GgufQuant::F16;
  bool drop_lora_experts = false;  // merge without the adapter's LoRA experts (a warning case)
};

struct ExportProgress {
  int64_t tensors_done = 0;
  int64_t tensors_total = 0;
  uint64_t bytes_written = 0;
  double elapsed_s = 0;
  std::string tensor;  // the one just written
  double fraction() const {
    return tensors_total > 0 ? static_cast<double>(tensors_done) / tensors_total : 0.0;
  }
};
using ExportProgressFn = std::function<void(const ExportProgress&)>;

struct MergedExportResult {
  std::filesystem::path weights;  // the .gguf file, or the first .safetensors file
  int64_t merged_modules = 0;     // LoRA pairs folded into weights (each expert counts)
  int64_t tensors = 0;
  uint64_t bytes = 0;
  bool dropped_lora_experts = false;
};

// Writes the merged model's weights (and for HF, config.json and the tokenizer files) into
// request.out_dir. Throws tandem::Error naming what is wrong: an adapter for another model, a
// DoRA adapter, LoRA experts without drop_lora_experts, an HF base for GGUF output, a quantized
// HF base other than fp8 (DeepSeek's block-scaled e4m3, written dequantised to the config's dtype).
// Checks `stop` between tensors (Error "cancelled"). The caller owns atomicity (it writes into a
// temporary dir and renames it).
MergedExportResult exportMergedWeights(const MergedExportRequest& request,
                                       const ExportProgressFn& progress, std::stop_token stop);

// The GGUF file name an export writes: "<base name>-merged-<quant>.gguf".
std::string mergedGgufFileName(const std::filesystem::path& base, GgufQuant quant);

}  // namespace tandem::model
