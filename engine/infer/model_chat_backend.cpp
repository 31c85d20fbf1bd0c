#include "engine/infer/model_chat_backend.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/causal_lm.h"
#include "engine/gpu/peft_adapter.h"
#include "engine/infer/generate.h"
#include "engine/infer/text_stream.h"
#include "engine/io/tokenizer.h"
#include "engine/train/chat_template.h"
#include "engine/train/supervised_encoder.h"
#include "engine/train/tokenizer_encoder.h"

namespace tandem::infer {

namespace {

namespace fs = std::filesystem;
using openai::ApiError;
using openai::RequestError;

constexpr const char* kBaseId = "base";

gpu::ModelOptions modelOptions(const ModelChatBackendOptions& o) {
  if (o.dtype != "fp32" && o.dtype != "bf16") throw Error("dtype '" + o.dtype + "' is not supported", "use fp32 or bf16");
  gpu::ModelOptions options;
  options.dtype = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  try {
    options.device = at::Device(o.device);
  } catch (const std::exception&) {
    throw Error("device '" + o.device + "' is not a device", "use cpu or cuda:N");
  }
  if (options.device.is_cuda() && !at::hasCUDA()) throw Error("device '" + o.device + "': no usable CUDA device", "use cpu");
  return options;
}

train::Conversation toConversation(const openai::ChatRequest& request) {
  train::Conversation conversation;
  for (const openai::ChatMessage& message : request.messages) {
    switch (message.role) {
      case openai::Role::System: conversation.system = message.content; break;
      case openai::Role::User: conversation.messages.push_back({train::Role::User, message.content}); break;
      case openai::Role::Assistant: conversation.messages.push_back({train::Role::Assistant, message.content}); break;
      case openai::Role::Tool: conversation.messages.push_back({train::Role::Observation, message.content}); break;
    }
  }
  return conversation;
}

}  // namespace

struct ModelChatBackend::Impl {
  ModelChatBackendOptions options;
  io::Tokenizer tokenizer;
  train::ChatTemplate chat_template;
  std::unique_ptr<train::TokenizerEncoder> encoder;
  int64_t context_tokens = 0;
  std::vector<std::string> ids;                            // "base", then the adapters in order
  std::map<std::string, std::unique_ptr<gpu::CausalLm>> models;  // by model id

  Impl(const ModelChatBackendOptions& o)
      : options(o), tokenizer(io::Tokenizer::load(o.model_dir)), chat_template(train::templateByName(o.template_name)) {}
};

ModelChatBackend::ModelChatBackend(const ModelChatBackendOptions& options) : impl_(std::make_unique<Impl>(options)) {
  Impl& m = *impl_;
  m.encoder = std::make_unique<train::TokenizerEncoder>(m.tokenizer, m.chat_template);
  const gpu::ModelOptions model_options = modelOptions(options);
  const io::ModelConfig config = io::readModelConfig(options.model_dir);
  m.context_tokens = config.max_position_embeddings;
  if (m.context_tokens <= 0) throw Error("config.json of " + options.model_dir.string() + " has no max_position_embeddings");
  m.ids.push_back(kBaseId);
  m.models[kBaseId] = gpu::CausalLm::load(options.model_dir, model_options, nullptr, ThreadPool::global());
  for (const auto& [name, dir] : options.adapters) {
    if (name.empty() || std::find(m.ids.begin(), m.ids.end(), name) != m.ids.end()) {
      throw Error("adapter name '" + name + "' is empty, 'base' or given twice", "give each --adapter NAME=DIR its own name");
    }
    const gpu::PeftAdapter adapter = gpu::readPeftAdapter(dir, config);
    const gpu::LoraPlan plan = gpu::loraPlanFor(adapter);
    auto model = gpu::CausalLm::load(options.model_dir, model_options, &plan, ThreadPool::global());
    gpu::applyPeftAdapter(adapter, *model);
    m.ids.push_back(name);
    m.models[name] = std::move(model);
  }
}

ModelChatBackend::~ModelChatBackend() = default;

std::vector<std::string> ModelChatBackend::modelIds() const { return impl_->ids; }

PreparedChat ModelChatBackend::prepare(const openai::ChatRequest& request) const {
  const Impl& m = *impl_;
  PreparedChat chat;
  chat.request = request;
  try {
    chat.prompt_ids = train::encodePieces(m.chat_template.renderForGeneration(toConversation(request)), *m.encoder);
  } catch (const Error& e) {
    throw RequestError({400, "The messages cannot be rendered with the " + m.chat_template.name() + " template: " + e.message(),
                        "invalid_request_error", "messages", "invalid_value"});
  }
  const int64_t prompt_tokens = static_cast<int64_t>(chat.prompt_ids.size());
  const int64_t room = m.context_tokens - prompt_tokens;
  const int64_t wanted = request.max_tokens.value_or(std::min(m.options.max_tokens_limit, room));
  if (room < 1 || wanted > room) {
    throw RequestError({400, "This model's maximum context length is " + std::to_string(m.context_tokens) +
                                 " tokens. However, you requested " + std::to_string(prompt_tokens + std::max<int64_t>(wanted, 1)) +
                                 " tokens (" + std::to_string(prompt_tokens) + " in the messages, " +
                                 std::to_string(std::max<int64_t>(wanted, 1)) +
                                 " in the completion). Please reduce the length of the messages or the completion.",
                        "invalid_request_error", request.max_tokens ? "max_tokens" : "messages", "context_length_exceeded"});
  }
  chat.max_new_tokens = wanted;
  return chat;
}

ChatResult ModelChatBackend::generate(const PreparedChat& chat, const TextSink& on_text, std::stop_token stop) {
  const Impl& m = *impl_;
  const gpu::CausalLm& model = *m.models.at(chat.request.model);
  const int32_t eos = m.encoder->eosId();
  TextStream stream([&](std::span<const int32_t> ids) { return m.tokenizer.decode(ids, /*skip_special_tokens=*/true); },
                    chat.request.stop);
  std::stop_source halt;  // a stop string, the client leaving, or the server stopping
  std::stop_callback forward(stop, [&halt] { halt.request_stop(); });
  ChatResult result;
  bool ended_by_eos = false;
  const auto emit = [&](const std::string& text) {
    if (text.empty()) return;
    result.text += text;
    if (!on_text(text)) halt.request_stop();
  };
  GreedySettings settings;
  settings.max_new_tokens = chat.max_new_tokens;
  settings.stop_ids = {eos};
  const std::vector<int32_t> generated = generateGreedy(
      model, chat.prompt_ids, settings,
      [&](int32_t id) {
        if (id == eos) {
          ended_by_eos = true;
          return;
        }
        emit(stream.push(id));
        if (stream.stopped()) halt.request_stop();
      },
      halt.get_token());
  emit(stream.finish());
  const bool full = static_cast<int64_t>(generated.size()) >= chat.max_new_tokens;
  result.cancelled = halt.stop_requested() && !stream.stopped();
  result.finish_reason = (ended_by_eos || stream.stopped() || !full) ? openai::FinishReason::Stop : openai::FinishReason::Length;
  result.usage = {static_cast<int64_t>(chat.prompt_ids.size()), static_cast<int64_t>(generated.size())};
  return result;
}

}  // namespace tandem::infer
