#pragma once
// ChatController: answers one question with the base model and with base + adapter, one after
// the other on an engine thread, streaming each answer as it grows (queued signals). The models
// stay loaded between questions while the folders stay the same. Stop ends the current answer at
// the next token.
//
// Generation is the engine's greedy decoder (engine/infer/generate.h) for now: sampling settings
// arrive with the chat/serve issue's generator.

#include <QObject>
#include <QString>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>

namespace tandem::ui {

enum class ChatSide { Base = 0, Adapter = 1 };

struct ChatRequest {
  QString base_model;   // HF folder
  QString adapter_dir;  // PEFT adapter folder; empty: base only
  QString template_name;
  QString system;
  QString question;
  int max_new_tokens = 64;
};

class ChatController : public QObject {
  Q_OBJECT

 public:
  explicit ChatController(QObject* parent = nullptr);
  ~ChatController() override;  // stops and joins

  bool isBusy() const { return busy_; }

 public slots:
  void ask(const tandem::ui::ChatRequest& request);  // ignored while busy
  void stop();

 signals:
  void busyChanged(bool busy);
  void status(const QString& text);                         // "loading the base model…"
  void streamed(int side, const QString& text_so_far);      // side: ChatSide
  void answered(int side, int tokens, double tokens_per_s);
  void failed(const QString& error);

 private:
  struct Models;
  void run(ChatRequest request, std::stop_token stop);

  std::unique_ptr<Models> models_;  // only touched on the engine thread
  bool busy_ = false;               // GUI thread only
  std::jthread thread_;
};

}  // namespace tandem::ui

Q_DECLARE_METATYPE(tandem::ui::ChatRequest)
