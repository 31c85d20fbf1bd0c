#include "engine/io/gguf_model.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>
#include <regex>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/io/bounded_json.h"
#include "engine/io/gguf_model_detail.h"

namespace tandem::io {
namespace fs = std::filesystem;

namespace {

bool hasGgufExtension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".gguf";
}

std::vector<fs::path> ggufFilesIn(const fs::path& dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec) && hasGgufExtension(entry.path())) found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// llama.cpp's gguf-split names shards MODEL-00001-of-00003.gguf.
bool isSplitShard(const fs::path& file) {
  static const std::regex shard(R"(.*-\d{5}-of-\d{5}\.gguf)", std::regex::icase);
  return std::regex_match(file.filename().string(), shard);
}

// One GGUF tensor name split into its layer and its role: "blk.12.attn_q.weight" -> 12, "attn_q",
// "weight"; "token_embd.weight" -> -1, "token_embd", "weight".
struct GgufName {
  int layer = -1;
  std::string role;
  std::string suffix;
};

std::optional<GgufName> splitName(const std::string& name) {
  GgufName out;
  std::string_view rest = name;
  if (rest.starts_with("blk.")) {
    rest.remove_prefix(4);
    const size_t dot = rest.find('.');
    if (dot == std::string_view::npos) return std::nullopt;
    int layer = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + dot, layer);
    if (ec != std::errc() || end != rest.data() + dot) return std::nullopt;
    out.layer = layer;
    rest.remove_prefix(dot + 1);
  }
  const size_t last = rest.rfind('.');
  if (last == std::string_view::npos) return std::nullopt;
  out.role = std::string(rest.substr(0, last));
  out.suffix = std::string(rest.substr(last + 1));
  if (out.suffix != "weight" && out.suffix != "bias") return std::nullopt;
  return out;
}

// The HF module (under model.layers.N.) of a per-layer GGUF role, for the architectures read.
// Experts (ffn_*_exps) and the shared-expert gate are handled by the caller.
std::optional<std::string> layerModule(const std::string& role, const std::string& model_type) {
  const bool qwen2moe = model_type == "qwen2_moe";
  const std::string shared = qwen2moe ? "mlp.shared_expert." : "mlp.shared_experts.";
  static const std::map<std::string, std::string, std::less<>> kCommon = {
      {"attn_norm", "input_layernorm"},
      {"ffn_norm", "post_attention_layernorm"},
      {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"},
      {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"},
      // Multi-head latent attention (deepseek2).
      {"attn_q_a", "self_attn.q_a_proj"},
      {"attn_q_a_norm", "self_attn.q_a_layernorm"},
      {"attn_q_b", "self_attn.q_b_proj"},
      {"attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"},
      {"attn_kv_a_norm", "self_attn.kv_a_layernorm"},
      {"attn_kv_b", "self_attn.kv_b_proj"},
      // Dense MLP, router.
      {"ffn_gate", "mlp.gate_proj"},
      {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
      {"ffn_gate_inp", "mlp.gate"},
  };
  if (auto it = kCommon.find(role); it != kCommon.end()) return it->second;
  if (role == "ffn_gate_shexp") return shared + "gate_proj";
  if (role == "ffn_up_shexp") return shared + "up_proj";
  if (role == "ffn_down_shexp") return shared + "down_proj";
  return std::nullopt;
}

std::string layerPrefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

}  // namespace

bool isGgufPath(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return hasGgufExtension(path);
  if (!fs::is_directory(path, ec) || fs::exists(path / "config.json", ec)) return false;
  return !ggufFilesIn(path).empty();
}

fs::path ggufFileOf(const fs::path& path) {
  std::error_code ec;
  fs::path file = path;
  if (fs::is_directory(path, ec)) {
    const std::vector<fs::path> files = ggufFilesIn(path);
    if (files.empty()) {
      throw Error(path.string() + " holds no .gguf file",
                  "pass the .gguf file itself or a Hugging Face model directory");
    }
    if (files.size() > 1 && !std::all_of(files.begin(), files.end(), isSplitShard)) {
      throw Error(path.string() + " holds " + std::to_string(files.size()) + " .gguf files (" +
                      files[0].filename().string() + ", " + files[1].filename().string() + ", ...)",
                  "pass the path of the one .gguf file to use");
    }
    file = files.front();
  }
  if (isSplitShard(file)) {
    throw Error(
        file.string() + " is one shard of a split GGUF model, which Tandem does not read yet",
        "merge the shards into one file with llama.cpp's `llama-gguf-split --merge FIRST_SHARD "
        "OUT.gguf`");
  }
  return file;
}

const GgufTensorSource* GgufModel::find(std::string_view hf_name) const {
  auto it = tensors_.find(hf_name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::unique_ptr<GgufModel> GgufModel::open(const fs::path& path) {
  std::unique_ptr<GgufModel> model(new GgufModel());
  model->file_ = std::make_unique<GgufFile>(GgufFile::open(ggufFileOf(path)));
  const GgufFile& file = *model->file_;
  model->gguf_arch_ = file.getString("general.architecture");
  const std::string model_type = gguf_detail::hfModelType(file);

  const GgufTensorInfo* embedding = file.findTensor("token_embd.weight");
  if (embedding == nullptr || embedding->ne.size() != 2) {
    throw Error(file.path().string() + ": no 2-D token_embd.weight tensor",
                "the file is not a complete GGUF model");
  }
  const bool tied = file.findTensor("output.weight") == nullptr;
  const nlohmann::json config = gguf_detail::hfConfig(file, model_type, embedding->ne[1], tied);
  model->config_json_ = config.dump(2);
  gguf_detail::HfTokenizerFiles tokenizer = gguf_detail::hfTokenizer(file);
  model->tokenizer_json_ = tokenizer.tokenizer.dump();
  model->tokenizer_config_json_ = tokenizer.tokenizer_config.dump(2);

  // llama.cpp's rope for llama (and mixtral, which it runs as llama) rotates neighbouring pairs,
  // so the converter permuted q/k rows from HF's halves into pairs; undo it per head.
  const bool permuted_rope = model->gguf_arch_ == "llama";
  const int heads = config.at("num_attention_heads").get<int>();
  const int kv_heads = config.at("num_key_value_heads").get<int>();

  auto add = [&](std::string hf_name, const GgufTensorInfo& t, int64_t expert,
                 std::vector<int64_t> shape) {
    GgufTensorSource source;
    source.hf_name = hf_name;
    source.tensor = &t;
    source.expert = expert;
    source.shape = std::move(shape);
    model->tensors_.emplace(std::move(hf_name), std::move(source));
  };
  for (const GgufTensorInfo& t : file.header().tensors) {
    const std::optional<GgufName> name = splitName(t.name);
    std::vector<int64_t> shape = t.torchShape();
    if (!name) {
      model->unmapped_.push_back(t.name);
      continue;
    }
    if (name->layer < 0) {
      static const std::map<std::string, std::string, std::less<>> kGlobal = {
          {"token_embd", "model.embed_tokens"},
          {"output_norm", "model.norm"},
          {"output", "lm_head"}};
      auto it = kGlobal.find(name->role);
      if (it == kGlobal.end()) {
        model->unmapped_.push_back(t.name);
      } else {
        add(it->second + "." + name->suffix, t, -1, shape);
      }
      continue;
    }
    const std::string p = layerPrefix(name->layer);
    static const std::map<std::string, std::string, std::less<>> kExperts = {
        {"ffn_gate_exps", "gate_proj"}, {"ffn_up_exps", "up_proj"}, {"ffn_down_exps", "down_proj"}};
    if (auto it = kExperts.find(name->role); it != kExperts.end()) {
      if (shape.size() != 3) {
        throw Error(file.path().string() + ": tensor " + t.name + " has shape " +
                        formatShape(shape) + ", but stacked experts are [n_expert, rows, cols]",
                    "the file is corrupt or from an unsupported converter");
      }
      const std::vector<int64_t> one{shape[1], shape[2]};
      for (int64_t e = 0; e < shape[0]; ++e) {
        add(p + "mlp.experts." + std::to_string(e) + "." + it->second + "." + name->suffix, t, e,
            one);
      }
      continue;
    }
    if (name->role == "exp_probs_b") {  // deepseek-v3's e_score_correction_bias
      add(p + "mlp.gate.e_score_correction_bias", t, -1, shape);
      continue;
    }
    if (name->role == "ffn_gate_inp_shexp") {  // qwen2moe: the file has [H], the HF Linear [1, H]
      add(p + "mlp.shared_expert_gate." + name->suffix, t, -1, {1, shape.back()});
      continue;
    }
    if (name->role == "attn_k_b" || name->role == "attn_v_b") continue;  // joined below
    const std::optional<std::string> module = layerModule(name->role, model_type);
    if (!module) {
      model->unmapped_.push_back(t.name);
      continue;
    }
    const std::string hf_name = p + *module + "." + name->suffix;
    add(hf_name, t, -1, shape);
    if (permuted_rope && (name->role == "attn_q" || name->role == "attn_k")) {
      const int n = name->role == "attn_q" ? heads : kv_heads;
      if (n <= 0 || shape[0] % (2 * n) != 0) {
        throw Error(
            file.path().string() + ": tensor " + t.name + " has " + std::to_string(shape[0]) +
                " rows, which do not split into " + std::to_string(n) + " heads of rope pairs",
            "the head counts in the metadata do not match the weights: the file is corrupt");
      }
      model->tensors_.at(hf_name).unpermute_heads = n;
    }
  }
  model->joinMlaKvB();
  return model;
}

void GgufModel::joinMlaKvB() {
  const GgufFile& file = *file_;
  // config_json_ renders the file's metadata, which readModelConfig checks only later: the layer
  // count is read as a checked integer, and no more layers are visited than the file has tensors.
  const nlohmann::json config =
      parseBoundedJson(config_json_, kModelConfigJsonLimits, file.path().string());
  const auto count = config.find("num_hidden_layers");
  const int64_t declared =
      count != config.end() && count->is_number_integer() ? count->get<int64_t>() : 0;
  const int layers = static_cast<int>(
      std::clamp<int64_t>(declared, 0, static_cast<int64_t>(file.header().tensors.size())));
  for (int layer = 0; layer < layers; ++layer) {
    const std::string blk = "blk." + std::to_string(layer) + ".";
    const GgufTensorInfo* k_b = file.findTensor(blk + "attn_k_b.weight");
    const GgufTensorInfo* v_b = file.findTensor(blk + "attn_v_b.weight");
    if (k_b == nullptr && v_b == nullptr) continue;
    const std::vector<int64_t> k =
        k_b ? k_b->torchShape() : std::vector<int64_t>{};  // [heads, kv_lora, nope]
    const std::vector<int64_t> v =
        v_b ? v_b->torchShape() : std::vector<int64_t>{};  // [heads, v, kv_lora]
    if (k.size() != 3 || v.size() != 3 || k[0] != v[0] || k[1] != v[2]) {
      throw Error(file.path().string() + ": layer " + std::to_string(layer) +
                      " needs attn_k_b [heads, kv_lora_rank, "
                      "nope] and attn_v_b [heads, v, kv_lora_rank]; it has " +
                      formatShape(k) + " and " + formatShape(v),
                  "the file is corrupt or from an unsupported converter");
    }
    GgufTensorSource source;
    source.hf_name = layerPrefix(layer) + "self_attn.kv_b_proj.weight";
    source.shape = {k[0] * (k[2] + v[1]), k[1]};
    source.tensor = k_b;
    source.mla_value = v_b;
    tensors_.emplace(source.hf_name, source);
  }
}

std::vector<float> GgufModel::read(const GgufTensorSource& source) const {
  const GgufTensorInfo& t = *source.tensor;
  int64_t numel = 1;
  for (int64_t d : source.shape) numel *= d;
  std::span<const std::byte> bytes = file_->tensorBytes(t);
  if (source.expert >= 0) {
    // Experts are whole rows of the stacked tensor, and rows are whole blocks (validated at parse).
    const uint64_t per_expert = t.byte_size / static_cast<uint64_t>(t.ne.back());
    bytes = bytes.subspan(static_cast<size_t>(per_expert * static_cast<uint64_t>(source.expert)),
                          static_cast<size_t>(per_expert));
  }
  if (source.mla_value != nullptr) return readMlaKvB(source);
  std::vector<float> values(static_cast<size_t>(numel));
  dequantizeGgml(t.type, bytes, numel, values.data(), t.name);
  if (source.unpermute_heads <= 0) return values;

  // The converter stored HF row (head h, half s, j) at row (h, j, s): rows are pairs of halves.
  const int64_t rows = source.shape[0];
  const int64_t cols = numel / rows;
  const int64_t head_rows = rows / source.unpermute_heads;
  const int64_t half = head_rows / 2;
  std::vector<float> hf(values.size());
  for (int64_t h = 0; h < source.unpermute_heads; ++h) {
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t j = 0; j < half; ++j) {
        const int64_t hf_row = h * head_rows + s * half + j;
        const int64_t gguf_row = h * head_rows + j * 2 + s;
        std::memcpy(&hf[static_cast<size_t>(hf_row * cols)],
                    &values[static_cast<size_t>(gguf_row * cols)],
                    static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
  return hf;
}

std::vector<float> GgufModel::readMlaKvB(const GgufTensorSource& source) const {
  const std::vector<float> k_b = file_->dequantize(*source.tensor);     // [heads, kv_lora, nope]
  const std::vector<float> v_b = file_->dequantize(*source.mla_value);  // [heads, v, kv_lora]
  const std::vector<int64_t> k = source.tensor->torchShape(), v = source.mla_value->torchShape();
  const int64_t heads = k[0], kv_lora = k[1], nope = k[2], v_dim = v[1];
  std::vector<float> kv_b(static_cast<size_t>(heads * (nope + v_dim) * kv_lora));
  auto at = [](const std::vector<float>& t, int64_t i) { return t[static_cast<size_t>(i)]; };
  for (int64_t h = 0; h < heads; ++h) {
    float* rows = &kv_b[static_cast<size_t>(h * (nope + v_dim) * kv_lora)];
    for (int64_t i = 0; i < nope; ++i) {
      for (int64_t c = 0; c < kv_lora; ++c)
        rows[i * kv_lora + c] = at(k_b, (h * kv_lora + c) * nope + i);
    }
    for (int64_t j = 0; j < v_dim; ++j) {
      for (int64_t c = 0; c < kv_lora; ++c)
        rows[(nope + j) * kv_lora + c] = at(v_b, (h * v_dim + j) * kv_lora + c);
    }
  }
  return kv_b;
}

}  // namespace tandem::io
