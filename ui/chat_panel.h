#pragma once
// The chat tab: a base model and an adapter (or a run's output), a conversation with both side by
// side (each side continues its own answers; New chat, or another model, starts over), the answers
// streaming, the sampling settings (LLaMA-Factory's generating arguments and defaults), and Stop.
// All generation runs in ChatController.

#include <QWidget>
#include <vector>

#include "ui/chat_controller.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QSpinBox;
class QTextBrowser;

namespace tandem::ui {

class ChatPanel : public QWidget {
  Q_OBJECT

 public:
  explicit ChatPanel(ChatController& controller, QWidget* parent = nullptr);

  void setModels(const QString& base_model, const QString& adapter_dir,
                 const QString& template_name);
  void setMaxNewTokens(int n);
  void setQuestion(const QString& question);
  // Greedy decoding (do_sample off) or sampling with these settings.
  void setSampling(bool sample, uint64_t seed = 0);
  QString answer(int side) const;  // the last answer of that side
  int turns() const { return static_cast<int>(history_[0].size()); }  // exchanges so far

 public slots:
  void send();
  void newChat();

 private:
  void render(int side);
  void finishTurn();

  ChatController& controller_;
  QLineEdit* base_;
  QLineEdit* adapter_;
  QComboBox* template_;
  QLineEdit* system_;
  QSpinBox* max_tokens_;
  QCheckBox* sample_;
  QDoubleSpinBox* temperature_;
  QDoubleSpinBox* top_p_;
  QSpinBox* top_k_;
  QDoubleSpinBox* repetition_;
  QSpinBox* seed_;
  QLineEdit* question_;
  QPushButton* send_;
  QPushButton* stop_;
  QTextBrowser* answers_[2];
  QLabel* stats_[2];
  QLabel* status_;
  QPushButton* new_chat_;
  std::vector<ChatTurn> history_[2];
  QString pending_;              // the question being answered
  QString current_[2];           // its answers so far
  bool failed_ = false;          // the turn being answered failed: it is not kept
  QString conversation_models_;  // base, adapter and template the history was made with
};

}  // namespace tandem::ui
