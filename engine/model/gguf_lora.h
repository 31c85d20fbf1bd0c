#pragma once
// LoRA adapters as llama.cpp reads them (`llama-cli --lora FILE.gguf`, llama_adapter_lora_init):
// a GGUF file with general.type "adapter", adapter.type "lora", adapter.lora.alpha, and for each
// adapted base tensor NAME two tensors NAME.lora_a (ggml ne [in, r], torch [r, in]) and
// NAME.lora_b (ne [r, out], torch [out, r]); stacked experts add a last ne dimension n_expert.
// llama.cpp scales each pair by alpha / r, r read from the pair itself.
//
// The names and layouts come from the base GGUF model the adapter is for, so the file loads on
// exactly that model: its q/k rows permuted as the base's are (llama, mixtral), its experts
// stacked as the base's ffn_*_exps. docs/gguf.md says what is exported and what cannot be.

#include <filesystem>

#include "engine/io/gguf_model.h"
#include "engine/model/peft_adapter.h"

namespace tandem::model {

// The converter's rope permutation of output rows (what GgufModel::read undoes): HF row
// (head h, half s, j) of `b` [rows, cols] is stored at row (h, j, s).
at::Tensor permuteRopeRows(const at::Tensor& b, int heads);

// Writes `adapter` (read with readPeftAdapter against the base's config) as a llama.cpp LoRA for
// `base`, atomically. Every LoRA pair must adapt a tensor `base` holds; a routed-expert LoRA needs
// every expert of its layer. Errors name the module and say what to do.
void writeGgufLora(const PeftAdapter& adapter, const io::GgufModel& base,
                   const std::filesystem::path& path);

// Reads a llama.cpp LoRA (what writeGgufLora, llama.cpp's convert_lora_to_gguf.py or another
// tool wrote) for the GGUF model `base`, as the PeftAdapter it applies: HF module names, the rope
// row permutation undone, stacked experts split per expert, each pair's alpha / its-own-rank
// scale kept (folded into B where a pair's rank is not the adapter's). Errors name the file and
// the tensor: not a LoRA adapter, a tensor the base does not hold, shapes that do not match.
PeftAdapter readGgufLora(const std::filesystem::path& path, const io::GgufModel& base);

// The adapter at `path` for the model of `config`: a llama.cpp LoRA GGUF file (for a GGUF base:
// config.source) or a PEFT adapter dir.
PeftAdapter readAdapterAt(const std::filesystem::path& path, const io::ModelConfig& config);

}  // namespace tandem::model
