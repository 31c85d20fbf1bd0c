#include "ui/chat_controller.h"

#include <QMetaObject>
#include <chrono>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/causal_lm.h"
#include "engine/gpu/peft_adapter.h"
#include "engine/infer/generate.h"
#include "engine/io/model_config.h"
#include "engine/io/tokenizer.h"
#include "engine/train/chat_template.h"
#include "engine/train/supervised_encoder.h"
#include "engine/train/tokenizer_encoder.h"
#include "ui/engine_thread.h"
#include "ui/error_text.h"

namespace tandem::ui {

// The loaded models, kept while the folders stay the same.
struct ChatController::Models {
  QString base_dir;
  QString adapter_dir;
  std::unique_ptr<gpu::CausalLm> base;
  std::unique_ptr<gpu::CausalLm> tuned;
  std::unique_ptr<io::Tokenizer> tokenizer;
};

ChatController::ChatController(QObject* parent) : QObject(parent), models_(std::make_unique<Models>()) {
  qRegisterMetaType<ChatRequest>();
}

ChatController::~ChatController() {
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
}

void ChatController::ask(const ChatRequest& request) {
  if (busy_) return;
  if (thread_.joinable()) thread_.join();  // the previous answer has ended
  busy_ = true;
  emit busyChanged(true);
  thread_ = std::jthread([this, request](std::stop_token stop) { run(request, stop); });
}

void ChatController::stop() { thread_.request_stop(); }

void ChatController::run(ChatRequest request, std::stop_token stop) {
  lowerCurrentThreadPriority();
  auto post = [this](auto fn) { QMetaObject::invokeMethod(this, fn, Qt::QueuedConnection); };
  try {
    Models& m = *models_;
    const std::filesystem::path base_dir = request.base_model.toStdString();
    if (!m.base || m.base_dir != request.base_model) {
      post([this] { emit status(tr("loading the base model…")); });
      m.tuned.reset();
      m.adapter_dir.clear();
      m.tokenizer = std::make_unique<io::Tokenizer>(io::Tokenizer::load(base_dir));
      m.base = gpu::CausalLm::load(base_dir, gpu::ModelOptions{}, nullptr, ThreadPool::global());
      m.base_dir = request.base_model;
    }
    if (!request.adapter_dir.isEmpty() && (!m.tuned || m.adapter_dir != request.adapter_dir)) {
      post([this] { emit status(tr("loading the adapter…")); });
      const io::ModelConfig model_config = io::readModelConfig(base_dir);
      const gpu::PeftAdapter adapter = gpu::readPeftAdapter(request.adapter_dir.toStdString(), model_config);
      const gpu::LoraPlan plan = gpu::loraPlanFor(adapter);
      m.tuned = gpu::CausalLm::load(base_dir, gpu::ModelOptions{}, &plan, ThreadPool::global());
      gpu::applyPeftAdapter(adapter, *m.tuned);
      m.adapter_dir = request.adapter_dir;
    }
    const train::ChatTemplate& chat_template = train::templateByName(request.template_name.toStdString());
    train::Conversation conversation;
    conversation.system = request.system.toStdString();
    conversation.messages.push_back({train::Role::User, request.question.toStdString()});
    const train::TokenizerEncoder encoder(*m.tokenizer, chat_template);
    const std::vector<int32_t> prompt = train::encodePieces(chat_template.renderForGeneration(conversation), encoder);
    infer::GreedySettings settings;
    settings.max_new_tokens = request.max_new_tokens;
    settings.stop_ids = {encoder.eosId()};
    const gpu::CausalLm* models[] = {m.base.get(), request.adapter_dir.isEmpty() ? nullptr : m.tuned.get()};
    for (int side = 0; side < 2 && !stop.stop_requested(); ++side) {
      if (!models[side]) continue;
      post([this, side] { emit status(side == 0 ? tr("the base model is answering…") : tr("the adapter is answering…")); });
      std::vector<int32_t> ids;
      const auto start = std::chrono::steady_clock::now();
      infer::generateGreedy(*models[side], prompt, settings, [&](int32_t id) {
        if (id == encoder.eosId()) return;
        ids.push_back(id);
        const QString text = QString::fromStdString(m.tokenizer->decode(ids, /*skip_special_tokens=*/true));
        post([this, side, text] { emit streamed(side, text); });
      }, stop);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const int n = static_cast<int>(ids.size());
      post([this, side, n, seconds] { emit answered(side, n, seconds > 0 ? n / seconds : 0); });
    }
    post([this, stopped = stop.stop_requested()] { emit status(stopped ? tr("stopped") : tr("done")); });
  } catch (const Error& e) {
    post([this, text = errorText(e)] { emit failed(text); });
  } catch (const std::exception& e) {
    post([this, text = QString::fromStdString(e.what())] { emit failed(text); });
  }
  post([this] {
    busy_ = false;
    emit busyChanged(false);
  });
}

}  // namespace tandem::ui
