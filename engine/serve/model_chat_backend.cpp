#include "engine/serve/model_chat_backend.h"

#include <algorithm>

#include "engine/core/error.h"

namespace tandem::serve {

namespace {

using openai::RequestError;

constexpr const char* kBaseId = "base";

std::vector<infer::ChatMessage> toMessages(const openai::ChatRequest& request) {
  std::vector<infer::ChatMessage> messages;
  for (const openai::ChatMessage& m : request.messages) {
    const char* role = m.role == openai::Role::System      ? "system"
                       : m.role == openai::Role::User      ? "user"
                       : m.role == openai::Role::Assistant ? "assistant"
                                                           : "observation";
    messages.push_back({role, m.content});
  }
  return messages;
}

// OpenAI's sampling fields over LLaMA-Factory's defaults (GenerationSettings); temperature 0 is
// greedy, as in llamafactory-cli api.
infer::GenerationSettings settingsFor(const openai::ChatRequest& request, int64_t max_new_tokens) {
  infer::GenerationSettings settings;
  if (request.temperature) {
    settings.do_sample = *request.temperature > 0;
    if (settings.do_sample) settings.temperature = *request.temperature;
  }
  if (request.top_p) settings.top_p = *request.top_p;
  if (request.top_k) settings.top_k = *request.top_k;
  if (request.repetition_penalty) settings.repetition_penalty = *request.repetition_penalty;
  settings.max_new_tokens = max_new_tokens;
  settings.stop = request.stop;
  settings.seed = request.seed;
  return settings;
}

}  // namespace

ModelChatBackend::ModelChatBackend(const ModelChatBackendOptions& options)
    : generator_(infer::Generator::load(options.model_dir, options.generator)),
      max_tokens_limit_(options.max_tokens_limit) {
  for (const auto& [name, dir] : options.adapters) {
    if (name.empty() || name == kBaseId || generator_->hasAdapter(name)) {
      throw Error("adapter name '" + name + "' is empty, 'base' or given twice",
                  "give each --adapter NAME=DIR its own name");
    }
    generator_->addAdapter(name, dir);
  }
  ids_.push_back(kBaseId);
  for (const std::string& name : generator_->adapterNames()) ids_.push_back(name);
  context_tokens_ = generator_->contextLength();
}

std::vector<std::string> ModelChatBackend::modelIds() const { return ids_; }

PreparedChat ModelChatBackend::prepare(const openai::ChatRequest& request) const {
  PreparedChat chat;
  chat.request = request;
  try {
    chat.prompt_ids = generator_->encodeChat(toMessages(request));
  } catch (const Error& e) {
    throw RequestError({400,
                        "The messages cannot be rendered with the " + generator_->templateName() +
                            " template: " + e.message(),
                        "invalid_request_error", "messages", "invalid_value"});
  }
  const int64_t context = context_tokens_;
  const int64_t prompt_tokens = static_cast<int64_t>(chat.prompt_ids.size());
  const int64_t room = context - prompt_tokens;
  const int64_t wanted = request.max_tokens.value_or(std::min(max_tokens_limit_, room));
  if (room < 1 || wanted > room) {
    const int64_t completion = std::max<int64_t>(wanted, 1);
    throw RequestError(
        {400,
         "This model's maximum context length is " + std::to_string(context) +
             " tokens. However, you requested " + std::to_string(prompt_tokens + completion) +
             " tokens (" + std::to_string(prompt_tokens) + " in the messages, " +
             std::to_string(completion) +
             " in the completion). Please reduce the length of the messages or the completion.",
         "invalid_request_error", request.max_tokens ? "max_tokens" : "messages",
         "context_length_exceeded"});
  }
  chat.max_new_tokens = wanted;
  return chat;
}

ChatResult ModelChatBackend::generate(const PreparedChat& chat, const TextSink& on_text,
                                      std::stop_token stop) {
  std::stop_source halt;  // the client left (on_text said so) or the server is stopping
  std::stop_callback forward(stop, [&halt] { halt.request_stop(); });
  // prepare() already rendered the messages (to check the context): feed those ids as they are.
  infer::TokenRequest request;
  request.adapter = chat.request.model;
  request.prompt = chat.prompt_ids;
  request.settings = settingsFor(chat.request, chat.max_new_tokens);
  const infer::GenerationResult generated = generator_->generate(
      request,
      [&](const infer::GenerationDelta& delta) {
        if (!delta.text.empty() && !halt.stop_requested() && !on_text(delta.text))
          halt.request_stop();
      },
      halt.get_token());
  ChatResult result;
  result.text = generated.text;
  result.cancelled = generated.finish_reason == infer::FinishReason::Cancelled;
  result.finish_reason = generated.finish_reason == infer::FinishReason::Length
                             ? openai::FinishReason::Length
                             : openai::FinishReason::Stop;
  result.usage = {generated.prompt_tokens, generated.completion_tokens};
  return result;
}

}  // namespace tandem::serve
