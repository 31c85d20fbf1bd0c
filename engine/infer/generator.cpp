#include "engine/infer/generator.h"

#include <algorithm>
#include <mutex>
#include <random>

#include "engine/chat/chat_template.h"
#include "engine/chat/supervised_encoder.h"
#include "engine/chat/tokenizer_encoder.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/infer/generate.h"
#include "engine/infer/text_stream.h"
#include "engine/io/tokenizer.h"
#include "engine/model/adapter_set.h"
#include "engine/model/machine_probe.h"
#include "engine/model/model.h"
#include "engine/model/model_resolver.h"

namespace tandem::infer {

namespace fs = std::filesystem;

std::string_view finishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "stop";
}

namespace {

// The KV cache the planner reserves for a chat: the context, up to this many tokens (a request
// allocates its own prompt + answer, which is smaller for nearly every chat).
constexpr int64_t kPlannedContextTokens = 8192;

// The memory plan on this machine, as for training (model_resolver.h), with no backward and a
// chat's KV cache; refused with the planner's advice when the model does not fit.
placement::MemoryPlan planGeneration(const GeneratorOptions& options,
                                     const io::ModelConfig& config) {
  placement::PlanRequest request = model::planRequestFor(options, config);
  request.kv_cache_tokens =
      config.max_position_embeddings > 0
          ? std::min<int64_t>(config.max_position_embeddings, kPlannedContextTokens)
          : kPlannedContextTokens;
  placement::MemoryPlan plan =
      model::planModel(request, options, model::usableHardware(options, model::probeMachine()));
  model::requireFits(plan, "this model");
  return plan;
}

chat::Conversation toConversation(const std::vector<ChatMessage>& messages) {
  chat::Conversation conv;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      if (!conv.messages.empty()) throw Error("a system message must come before the others");
      conv.system += m.content;
      continue;
    }
    chat::Role role;
    if (m.role == "user")
      role = chat::Role::User;
    else if (m.role == "assistant")
      role = chat::Role::Assistant;
    else if (m.role == "observation" || m.role == "tool")
      role = chat::Role::Observation;
    else
      throw Error("message " + std::to_string(i) + " has the unknown role '" + m.role + "'",
                  "use system, user, assistant or observation");
    // Prompts sit at even positions, answers at odd ones (LLaMA-Factory's alternation).
    const bool prompt_slot = conv.messages.size() % 2 == 0;
    const bool is_prompt = role == chat::Role::User || role == chat::Role::Observation;
    if (prompt_slot != is_prompt) {
      throw Error("messages must alternate user and assistant (message " + std::to_string(i) +
                  " is '" + m.role + "')");
    }
    conv.messages.push_back({role, m.content});
  }
  if (conv.messages.size() % 2 != 1) throw Error("the conversation must end with a user message");
  return conv;
}

}  // namespace

// LLaMA-Factory's usual template for each model family (its README's model table).
std::string guessTemplateName(const io::ModelConfig& config, const io::Tokenizer& tokenizer) {
  switch (config.architecture) {
    case io::Architecture::Qwen3:
    case io::Architecture::Qwen3Moe: return "qwen3";
    case io::Architecture::Qwen2:
    case io::Architecture::Qwen2Moe: return "qwen";
    case io::Architecture::DeepseekV3: return "deepseek3";
    case io::Architecture::DeepseekV2: return "deepseek";
    case io::Architecture::Mixtral: return "mistral";
    case io::Architecture::Llama: return tokenizer.tokenToId("<|eot_id|>") ? "llama3" : "default";
  }
  return "default";
}

struct Generator::Impl {
  Impl(io::Tokenizer tok, chat::ChatTemplate tmpl)
      : tokenizer(std::move(tok)), chat_template(std::move(tmpl)) {}

  std::unique_ptr<model::Model> model;
  io::Tokenizer tokenizer;
  chat::ChatTemplate chat_template;
  std::unique_ptr<chat::TokenizerEncoder> encoder;
  std::unique_ptr<model::AdapterSet> adapters;
  std::vector<int32_t> stop_ids;        // eos and the template's single-token stop words
  std::vector<std::string> stop_texts;  // the template's stop words that are not one token
  std::string model_name;
  std::mutex mutex;  // one request (or adapter load) at a time
  // What adapterNames / hasAdapter answer, readable while a request runs.
  std::mutex catalog_mutex;
  std::vector<std::string> adapter_names;
  bool merged = false;

  GenerationResult run(const std::string& adapter, const std::vector<int32_t>& prompt,
                       const GenerationSettings& settings, const DeltaCallback& on_delta,
                       std::stop_token stop);
};

Generator::Generator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Generator::~Generator() = default;

std::unique_ptr<Generator> Generator::load(const fs::path& model_dir,
                                           const GeneratorOptions& options) {
  return load(model_dir, options, ThreadPool::global());
}

std::unique_ptr<Generator> Generator::load(const fs::path& model_dir,
                                           const GeneratorOptions& options, ThreadPool& pool) {
  const io::ModelConfig config = io::readModelConfig(model_dir);
  const model::ModelOptions model_options =
      model::resolveModelOptions(options, config, planGeneration(options, config));
  io::Tokenizer tokenizer = io::Tokenizer::load(model_dir);
  const std::string template_name =
      options.template_name.empty() ? guessTemplateName(config, tokenizer) : options.template_name;
  chat::ChatTemplate chat_template = chat::templateByName(template_name);
  if (!options.default_system.empty()) chat_template.setDefaultSystem(options.default_system);
  chat_template.setEnableThinking(options.enable_thinking);

  auto impl = std::make_unique<Impl>(std::move(tokenizer), std::move(chat_template));
  impl->encoder = std::make_unique<chat::TokenizerEncoder>(impl->tokenizer, impl->chat_template);
  impl->stop_ids.push_back(impl->encoder->eosId());
  if (const auto eos = impl->tokenizer.eosId()) impl->stop_ids.push_back(*eos);
  for (const std::string& word : impl->chat_template.stopWords()) {
    if (const auto id = impl->tokenizer.tokenToId(word))
      impl->stop_ids.push_back(*id);
    else
      impl->stop_texts.push_back(word);
  }
  impl->model = model::Model::load(model_dir, model_options, nullptr, pool);
  impl->adapters = std::make_unique<model::AdapterSet>(*impl->model);
  impl->model_name = fs::absolute(model_dir).lexically_normal().filename().string();
  if (impl->model_name.empty())
    impl->model_name = fs::absolute(model_dir).lexically_normal().parent_path().filename().string();
  return std::unique_ptr<Generator>(new Generator(std::move(impl)));
}

void Generator::addAdapter(const std::string& name, const fs::path& dir, AdapterMode mode) {
  std::lock_guard lock(impl_->mutex);
  impl_->adapters->add(name, dir, mode);
  std::lock_guard catalog(impl_->catalog_mutex);
  impl_->adapter_names = impl_->adapters->names();
  impl_->merged = impl_->adapters->merged();
}

std::vector<std::string> Generator::adapterNames() const {
  std::lock_guard catalog(impl_->catalog_mutex);
  return impl_->adapter_names;
}

bool Generator::hasAdapter(std::string_view name) const {
  if (name.empty() || name == "base") return baseAvailable();
  std::lock_guard catalog(impl_->catalog_mutex);
  return std::find(impl_->adapter_names.begin(), impl_->adapter_names.end(), name) !=
         impl_->adapter_names.end();
}

bool Generator::baseAvailable() const {
  std::lock_guard catalog(impl_->catalog_mutex);
  return !impl_->merged;
}

std::vector<int32_t> Generator::encodeChat(const std::vector<ChatMessage>& messages) const {
  const chat::Pieces pieces = impl_->chat_template.renderForGeneration(toConversation(messages));
  return chat::encodePieces(pieces, *impl_->encoder);
}

GenerationResult Generator::chat(const ChatRequest& request, const DeltaCallback& on_delta,
                                 std::stop_token stop) {
  return impl_->run(request.adapter, encodeChat(request.messages), request.settings, on_delta,
                    stop);
}

GenerationResult Generator::generate(const TokenRequest& request, const DeltaCallback& on_delta,
                                     std::stop_token stop) {
  return impl_->run(request.adapter, request.prompt, request.settings, on_delta, stop);
}

GenerationResult Generator::Impl::run(const std::string& adapter,
                                      const std::vector<int32_t>& prompt,
                                      const GenerationSettings& settings,
                                      const DeltaCallback& on_delta, std::stop_token stop) {
  std::lock_guard lock(mutex);
  adapters->activate(adapter);
  const uint64_t seed = settings.seed ? *settings.seed : std::random_device{}();
  std::vector<std::string> stop_strings = stop_texts;
  stop_strings.insert(stop_strings.end(), settings.stop.begin(), settings.stop.end());
  TextStream stream(tokenizer, std::move(stop_strings),
                    settings.stop_on_eos ? stop_ids : std::vector<int32_t>{}, on_delta);
  TokenOutcome outcome;
  try {
    outcome = generateTokens(
        *model, prompt, settings, stop_ids, seed, [&stream](int32_t id) { return stream.push(id); },
        stop);
  } catch (const OutOfMemory& e) {
    // The request's caches unwind with it: the next request starts clean.
    throw Error("out of memory while answering a " + std::to_string(prompt.size()) +
                    "-token prompt: " + e.message(),
                "shorten the conversation or the answer (max_tokens), or load the model with fewer "
                "--gpu-experts");
  }
  stream.finish();
  GenerationResult result;
  result.finish_reason = outcome.finish_reason;
  result.text = stream.text();
  result.token_ids = outcome.ids;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  result.completion_tokens = static_cast<int64_t>(outcome.ids.size());
  result.prefill_seconds = outcome.prefill_seconds;
  result.decode_seconds = outcome.decode_seconds;
  return result;
}

const io::Tokenizer& Generator::tokenizer() const { return impl_->tokenizer; }
const std::string& Generator::templateName() const { return impl_->chat_template.name(); }
const std::string& Generator::modelName() const { return impl_->model_name; }
int64_t Generator::contextLength() const { return impl_->model->config().max_position_embeddings; }
model::AppliedPlacement Generator::placement() const { return impl_->model->placement(); }

}  // namespace tandem::infer
