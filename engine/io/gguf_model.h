#pragma once
// A GGUF model (as llama.cpp's convert_hf_to_gguf.py writes it, quantized or not) seen as the
// Hugging Face model it was converted from: a config.json, a tokenizer.json + tokenizer_config.json
// and every tensor under its HF name in torch layout. The rest of the engine reads HF models, so
// this one translation is all a GGUF file needs (transformers' own gguf_file= loading works the
// same way). docs/gguf.md lists the architectures, keys and tensors it maps, and what it refuses.
//
// Tensors are dequantised to fp32 on request (ggml's block formats, exactly), stacked experts
// ([n_expert, ...]) are sliced per expert, the q/k rows that the converter permuted for
// llama.cpp's rope (llama, mixtral) are put back in HF's order, and deepseek2's kv_b_proj is
// put back together from the two halves the converter split it into.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/io/gguf.h"

namespace tandem::io {

// `path` names a GGUF model: a file ending in .gguf, or a directory with no config.json that
// holds exactly one .gguf file (a split model's first shard "-00001-of-0000N.gguf" is refused by
// ggufFileOf with what to do).
bool isGgufPath(const std::filesystem::path& path);
// The .gguf file `path` names (itself, or the one in the directory). Error when there is none or
// several, or when the file is one shard of a split model.
std::filesystem::path ggufFileOf(const std::filesystem::path& path);

// Where one HF tensor's values are in the file.
struct GgufTensorSource {
  std::string hf_name;
  std::vector<int64_t> shape;  // torch order, as the HF model has it
  const GgufTensorInfo* tensor = nullptr;
  int64_t expert = -1;      // >= 0: this expert's slice of a stacked [n_expert, ...] tensor
  int unpermute_heads = 0;  // > 0: undo the converter's rope row permutation over this many heads
  // deepseek2's kv_b_proj [heads × (nope + v), kv_lora_rank], which the converter split for
  // llama.cpp's absorbed MLA: `tensor` is attn_k_b [heads, kv_lora_rank, nope] (transposed per
  // head) and this is attn_v_b [heads, v, kv_lora_rank].
  const GgufTensorInfo* mla_value = nullptr;
};

class GgufModel {
 public:
  // Opens and maps the file, validates it, and builds the HF view. Errors name the file and the
  // key or tensor (unsupported architecture, missing metadata, a tensor with an unexpected shape).
  static std::unique_ptr<GgufModel> open(const std::filesystem::path& path);

  const GgufFile& file() const { return *file_; }
  const std::filesystem::path& path() const { return file_->path(); }
  const std::string& ggufArchitecture() const { return gguf_arch_; }  // general.architecture

  // config.json (transformers 5 spelling, "dtype": the compute type the weights suggest).
  const std::string& configJson() const { return config_json_; }
  // tokenizer.json and tokenizer_config.json (eos/bos/pad, add_bos_token, chat_template).
  const std::string& tokenizerJson() const { return tokenizer_json_; }
  const std::string& tokenizerConfigJson() const { return tokenizer_config_json_; }

  // By HF name.
  const std::map<std::string, GgufTensorSource, std::less<>>& tensors() const { return tensors_; }
  const GgufTensorSource* find(std::string_view hf_name) const;
  // The source's values, fp32, row-major in source.shape. Error naming the tensor when its type
  // has no dequantizer.
  std::vector<float> read(const GgufTensorSource& source) const;
  // GGUF tensors this view left out (names nothing maps: rope_freqs, an MTP layer, ...).
  const std::vector<std::string>& unmapped() const { return unmapped_; }

 private:
  GgufModel() = default;
  void joinMlaKvB();
  std::vector<float> readMlaKvB(const GgufTensorSource& source) const;

  std::unique_ptr<GgufFile> file_;
  std::string gguf_arch_;
  std::string config_json_;
  std::string tokenizer_json_;
  std::string tokenizer_config_json_;
  std::map<std::string, GgufTensorSource, std::less<>> tensors_;
  std::vector<std::string> unmapped_;
};

}  // namespace tandem::io
