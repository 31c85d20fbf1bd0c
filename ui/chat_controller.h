#pragma once
// ChatController: answers the next message of a conversation with the base model and with
// base + adapter (each side with its own earlier answers), one after the other on an engine thread,
// streaming each answer as it grows (queued signals). It drives the engine's Generator
// (engine/infer/generator.h: KV cache, LLaMA-Factory sampling, stop words), which stays loaded
// while the model folder and template stay the same; adapters are added to it as they are asked
// for. Both answers use the same settings and the same seed, so the difference between them is the
// adapter's. Stop ends the current answer at the next token.

#include <QObject>
#include <QString>
#include <cstdint>
#include <memory>
#include <stop_token>
#include <thread>
#include <vector>

#include "engine/infer/generator.h"

namespace tandem::ui {

enum class ChatSide { Base = 0, Adapter = 1 };

// One earlier exchange of a conversation, as one side saw it.
struct ChatTurn {
  QString user;
  QString assistant;
};

struct ChatQuestion {
  QString base_model;     // HF folder
  QString adapter_dir;    // PEFT adapter or training output folder; empty: base only
  QString template_name;  // empty: the Generator picks one from the model type
  QString system;
  QString question;
  // The conversation so far, per side (ChatSide): each side continues its own answers, so the
  // adapter's second answer follows the adapter's first one.
  std::vector<ChatTurn> history[2];
  infer::GenerationSettings settings;  // LLaMA-Factory's generating defaults
};

class ChatController : public QObject {
  Q_OBJECT

 public:
  explicit ChatController(QObject* parent = nullptr);
  ~ChatController() override;  // stops and joins

  bool isBusy() const { return busy_; }

 public slots:
  void ask(const tandem::ui::ChatQuestion& question);  // ignored while busy
  void stop();

 signals:
  void busyChanged(bool busy);
  void status(const QString& text);                     // "loading the base model…"
  void streamed(int side, const QString& text_so_far);  // side: ChatSide
  void answered(int side, const QString& finish_reason, int tokens, double tokens_per_s);
  void failed(const QString& error);

 private:
  struct Models;
  void run(ChatQuestion question, std::stop_token stop);

  std::unique_ptr<Models> models_;  // only touched on the engine thread
  bool busy_ = false;               // GUI thread only
  std::jthread thread_;
};

// The generator options the studio uses for a model folder: fp32 for fp32 checkpoints (the demo),
// bf16 otherwise; the first GPU when there is one, else the CPU.
infer::GeneratorOptions chatOptionsFor(const QString& model_dir, const QString& template_name);

}  // namespace tandem::ui

Q_DECLARE_METATYPE(tandem::ui::ChatQuestion)
