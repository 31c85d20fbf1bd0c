#pragma once
// The chat tab: a base model and an adapter (or a run's output), one question, the two answers
// side by side as they stream, the sampling settings (LLaMA-Factory's generating arguments and
// defaults), and Stop. All generation runs in ChatController.

#include <QWidget>

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QSpinBox;
class QTextBrowser;

namespace tandem::ui {

class ChatController;

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
  QString answer(int side) const;

 public slots:
  void send();

 private:
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
};

}  // namespace tandem::ui
