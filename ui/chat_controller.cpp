#include "ui/chat_controller.h"

#include <QMetaObject>
#include <random>

#include "engine/core/error.h"
#include "engine/io/model_config.h"
#include "ui/engine_thread.h"
#include "ui/error_text.h"

namespace tandem::ui {

// The loaded generator and the adapter folders added to it (by name "adapter-N").
struct ChatController::Models {
  QString base_dir;
  QString template_name;
  std::unique_ptr<infer::Generator> generator;
  std::vector<QString> adapter_dirs;  // adapter-<index>
};

// Placed as every product places a model (the memory planner's placement for this machine), in
// the checkpoint's own precision when that is fp32 (the demo model), else bf16.
infer::GeneratorOptions chatOptionsFor(const QString& model_dir, const QString& template_name) {
  infer::GeneratorOptions options;
  options.bf16 = io::readModelConfig(model_dir.toStdString()).dtype != "float32";
  options.template_name = template_name.toStdString();
  return options;
}

ChatController::ChatController(QObject* parent)
    : QObject(parent), models_(std::make_unique<Models>()) {
  qRegisterMetaType<ChatQuestion>();
}

ChatController::~ChatController() {
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
}

void ChatController::ask(const ChatQuestion& question) {
  if (busy_) return;
  if (thread_.joinable()) thread_.join();  // the previous answer has ended
  busy_ = true;
  emit busyChanged(true);
  thread_ = std::jthread([this, question](std::stop_token stop) { run(question, stop); });
}

void ChatController::stop() { thread_.request_stop(); }

void ChatController::run(ChatQuestion question, std::stop_token stop) {
  lowerCurrentThreadPriority();
  auto post = [this](auto fn) { QMetaObject::invokeMethod(this, fn, Qt::QueuedConnection); };
  try {
    Models& m = *models_;
    if (!m.generator || m.base_dir != question.base_model ||
        m.template_name != question.template_name) {
      post([this] { emit status(tr("loading the base model…")); });
      m.generator.reset();
      m.adapter_dirs.clear();
      m.generator =
          infer::Generator::load(question.base_model.toStdString(),
                                 chatOptionsFor(question.base_model, question.template_name));
      m.base_dir = question.base_model;
      m.template_name = question.template_name;
    }
    std::string adapter;
    if (!question.adapter_dir.isEmpty()) {
      auto known = std::find(m.adapter_dirs.begin(), m.adapter_dirs.end(), question.adapter_dir);
      if (known == m.adapter_dirs.end()) {
        post([this] { emit status(tr("loading the adapter…")); });
        m.generator->addAdapter("adapter-" + std::to_string(m.adapter_dirs.size()),
                                question.adapter_dir.toStdString());
        m.adapter_dirs.push_back(question.adapter_dir);
        known = m.adapter_dirs.end() - 1;
      }
      adapter = "adapter-" + std::to_string(known - m.adapter_dirs.begin());
    }
    infer::ChatRequest request;
    request.settings = question.settings;
    // One seed for both answers: with sampling on, the adapter is the only difference.
    if (request.settings.do_sample && !request.settings.seed)
      request.settings.seed = std::random_device{}();
    const std::string sides[] = {"base", adapter};
    for (int side = 0; side < 2 && !stop.stop_requested(); ++side) {
      if (sides[side].empty()) continue;
      request.adapter = sides[side];
      request.messages.clear();
      if (!question.system.isEmpty())
        request.messages.push_back({"system", question.system.toStdString()});
      for (const ChatTurn& turn : question.history[side]) {
        request.messages.push_back({"user", turn.user.toStdString()});
        request.messages.push_back({"assistant", turn.assistant.toStdString()});
      }
      request.messages.push_back({"user", question.question.toStdString()});
      post([this, side] {
        emit status(side == 0 ? tr("the base model is answering…")
                              : tr("the adapter is answering…"));
      });
      std::string text;
      const infer::GenerationResult result = m.generator->chat(
          request,
          [&](const infer::GenerationDelta& delta) {
            text += delta.text;
            post([this, side, t = QString::fromStdString(text)] { emit streamed(side, t); });
          },
          stop);
      const int n = static_cast<int>(result.completion_tokens);
      const double rate = result.decode_seconds > 0 ? n / result.decode_seconds : 0;
      const QString reason =
          QString::fromLatin1(infer::finishReasonName(result.finish_reason).data());
      post([this, side, reason, n, rate] { emit answered(side, reason, n, rate); });
    }
    post([this, stopped = stop.stop_requested()] {
      emit status(stopped ? tr("stopped") : tr("done"));
    });
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
