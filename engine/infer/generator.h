#pragma once
// Generator: one base model with named LoRA adapters, answering chat or token prompts.
//
// Usage: `auto gen = Generator::load(model_dir, GeneratorOptions{});` loads the base where the
// memory planner places it on this machine (model_resolver.h: as training does, layers split
// over the GPUs, routed experts on the CPU expert engine); `gen->addAdapter("tuned", dir)` reads a
// PEFT adapter dir, a training output dir or one of its checkpoint-N/ dirs, and keeps it beside the
// base, unmerged. Each request names its adapter (`""` or `"base"`: the bare base) and carries
// GenerationSettings (LLaMA-Factory's generating defaults); `gen->chat(request, on_delta, stop)`
// renders the messages with the chat template, then prefills and decodes with a KV cache,
// calling `on_delta` with each new piece of text and the token ids behind it, and returns why it
// ended ("stop", "length" or "cancelled") with the prompt and completion token counts. Requests
// are served one at a time (a mutex inside; a second caller waits), and one may be cancelled
// from another thread through its std::stop_token; adapterNames / hasAdapter / baseAvailable
// answer at once, even while a request runs. Errors are tandem::Error. This header has no
// libtorch, so servers and UIs include it cheaply.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/adapter_set.h"
#include "engine/model/model.h"
#include "engine/model/model_request.h"

namespace tandem {
class ThreadPool;
}
namespace tandem::io {
class Tokenizer;
struct ModelConfig;
}  // namespace tandem::io

namespace tandem::infer {

// How the base model is placed (the ModelRequest every product fills: the memory planner's
// placement on this machine unless device / layer_devices / gpu_experts say otherwise, as for
// training) and which template turns messages into a prompt.
// LLaMA-Factory's usual template for the model family (GeneratorOptions::template_name's default).
std::string guessTemplateName(const io::ModelConfig& config, const io::Tokenizer& tokenizer);

struct GeneratorOptions : model::ModelRequest {
  GeneratorOptions() {
    bf16 = true;
    training = false;  // no backward: no Wᵀ packs, no optimizer memory
  }
  // LLaMA-Factory template name (qwen3, llama3, deepseek3, ...); empty: chosen from the
  // model type (qwen3*: qwen3, qwen2*: qwen, deepseek_v3: deepseek3, deepseek_v2: deepseek,
  // llama with a Llama-3 tokenizer: llama3, mixtral: mistral, otherwise default).
  std::string template_name;
  std::string default_system;  // replaces the template's default system prompt when not empty
  // Qwen3-style templates: emit the empty <think></think> block when false (LLaMA-Factory's
  // enable_thinking).
  bool enable_thinking = true;
};

// LLaMA-Factory's GeneratingArguments (hparams/generating_args.py) and their defaults.
struct GenerationSettings {
  bool do_sample = true;            // false: greedy (argmax), the sampling fields are ignored
  double temperature = 0.95;        // > 0
  double top_p = 0.7;               // (0, 1]
  int64_t top_k = 50;               // 0: no top-k filter
  double repetition_penalty = 1.0;  // > 0; transformers' RepetitionPenaltyLogitsProcessor
  int64_t max_new_tokens = 1024;    // > 0
  std::vector<std::string> stop;    // extra stop strings (the template's stop words always apply)
  std::optional<uint64_t> seed;     // nullopt: a fresh random seed per request
  // Stop on the tokenizer's eos and the template's stop words. Off only for tests that must
  // run max_new_tokens exactly.
  bool stop_on_eos = true;
};

struct ChatMessage {
  std::string role;  // system | user | assistant | observation (tool is read as observation)
  std::string content;
};

// One piece of streamed output: the new text (UTF-8 complete; a stop string is never shown)
// and the token ids that produced it since the last delta.
struct GenerationDelta {
  std::string_view text;
  std::span<const int32_t> token_ids;
};
using DeltaCallback = std::function<void(const GenerationDelta&)>;

enum class FinishReason { Stop, Length, Cancelled };
std::string_view finishReasonName(FinishReason reason);  // "stop" | "length" | "cancelled"

struct GenerationResult {
  FinishReason finish_reason = FinishReason::Stop;
  std::string text;                // the whole completion, without the stop word / string
  std::vector<int32_t> token_ids;  // every generated id (including a final eos / stop token)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // == token_ids.size()
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

struct ChatRequest {
  std::string adapter;  // "" or "base": the base model; otherwise an added adapter's name
  std::vector<ChatMessage> messages;  // ends with a user (or observation) message
  GenerationSettings settings;
};

struct TokenRequest {
  std::string adapter;
  std::vector<int32_t> prompt;  // token ids, used as given (no template, no bos added)
  GenerationSettings settings;
};

using model::AdapterMode;

class Generator {
 public:
  // Throws tandem::Error on a bad model dir, tokenizer, dtype, device or template name.
  static std::unique_ptr<Generator> load(const std::filesystem::path& model_dir,
                                         const GeneratorOptions& options);
  static std::unique_ptr<Generator> load(const std::filesystem::path& model_dir,
                                         const GeneratorOptions& options, ThreadPool& pool);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // `dir`: a PEFT adapter dir (adapter_config.json + adapter_model.safetensors), a Tandem
  // checkpoint-N/ dir, or a training output dir (its final adapter, else its newest checkpoint).
  // `name` must be new and not "base". Throws tandem::Error when the adapter does not fit.
  void addAdapter(const std::string& name, const std::filesystem::path& dir,
                  AdapterMode mode = AdapterMode::Unmerged);
  std::vector<std::string> adapterNames() const;  // in the order added
  bool hasAdapter(std::string_view name) const;   // "" and "base" count as present unless merged
  bool baseAvailable() const;                     // false once an adapter is merged

  // Streams the answer to the conversation. `on_delta` may be empty. Throws tandem::Error on an
  // unknown adapter, bad settings or a prompt longer than the model's context.
  GenerationResult chat(const ChatRequest& request, const DeltaCallback& on_delta = {},
                        std::stop_token stop = {});
  GenerationResult generate(const TokenRequest& request, const DeltaCallback& on_delta = {},
                            std::stop_token stop = {});

  // The prompt ids chat() would feed for these messages (for limits and token counting).
  std::vector<int32_t> encodeChat(const std::vector<ChatMessage>& messages) const;

  const io::Tokenizer& tokenizer() const;
  const std::string& templateName() const;
  const std::string& modelName() const;  // the model dir's name
  int64_t contextLength() const;         // max_position_embeddings
  // Where the model's parts run: the memory plan's placement for this machine (or the overrides).
  model::AppliedPlacement placement() const;

  struct Impl;

 private:
  explicit Generator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::infer
