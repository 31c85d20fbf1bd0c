#include "ui/chat_panel.h"

#include <QComboBox>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QShortcut>
#include <QSpinBox>
#include <QTextBrowser>
#include <QVBoxLayout>

#include "engine/train/chat_template.h"
#include "ui/chat_controller.h"
#include "ui/path_field.h"

namespace tandem::ui {

ChatPanel::ChatPanel(ChatController& controller, QWidget* parent) : QWidget(parent), controller_(controller) {
  base_ = new QLineEdit;
  base_->setPlaceholderText(tr("Hugging Face model folder"));
  adapter_ = new QLineEdit;
  adapter_->setPlaceholderText(tr("LoRA adapter folder (a run's output); empty: base model only"));
  template_ = new QComboBox;
  for (const std::string& name : train::templateNames()) template_->addItem(QString::fromStdString(name));
  template_->setToolTip(tr("The chat template the adapter was trained with"));
  system_ = new QLineEdit;
  system_->setPlaceholderText(tr("optional system prompt (the template's default otherwise)"));
  max_tokens_ = new QSpinBox;
  max_tokens_->setRange(1, 8192);
  max_tokens_->setValue(64);
  max_tokens_->setToolTip(tr("The longest answer, in tokens; decoding is greedy"));
  auto* form = new QFormLayout;
  form->addRow(tr("&Base model:"), pathField(base_, PathKind::Folder, tr("Base model")));
  form->addRow(tr("&Adapter:"), pathField(adapter_, PathKind::Folder, tr("Adapter")));
  auto* options = new QHBoxLayout;
  options->addWidget(template_);
  options->addWidget(new QLabel(tr("Max new tokens:")));
  options->addWidget(max_tokens_);
  options->addStretch(1);
  auto* template_label = new QLabel(tr("&Template:"));
  template_label->setBuddy(template_);
  form->addRow(template_label, options);
  form->addRow(tr("S&ystem:"), system_);

  const QString titles[2] = {tr("Base model"), tr("With adapter")};
  auto* answers = new QHBoxLayout;
  for (int side = 0; side < 2; ++side) {
    auto* box = new QGroupBox(titles[side]);
    auto* layout = new QVBoxLayout(box);
    answers_[side] = new QTextBrowser;
    answers_[side]->setAccessibleName(titles[side]);
    answers_[side]->setPlaceholderText(tr("The answer streams here."));
    stats_[side] = new QLabel;
    layout->addWidget(answers_[side], 1);
    layout->addWidget(stats_[side]);
    answers->addWidget(box, 1);
  }
  question_ = new QLineEdit;
  question_->setPlaceholderText(tr("Ask something, then press Enter"));
  question_->setAccessibleName(tr("Question"));
  send_ = new QPushButton(QIcon(QStringLiteral(":/icons/play.svg")), tr("&Send"));
  stop_ = new QPushButton(QIcon(QStringLiteral(":/icons/stop.svg")), tr("S&top"));
  stop_->setEnabled(false);
  stop_->setShortcut(QKeySequence(Qt::Key_Escape));
  status_ = new QLabel;
  auto* ask = new QHBoxLayout;
  ask->addWidget(question_, 1);
  ask->addWidget(send_);
  ask->addWidget(stop_);

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(form);
  layout->addLayout(answers, 1);
  layout->addLayout(ask);
  layout->addWidget(status_);

  connect(send_, &QPushButton::clicked, this, &ChatPanel::send);
  connect(question_, &QLineEdit::returnPressed, this, &ChatPanel::send);
  connect(stop_, &QPushButton::clicked, &controller_, &ChatController::stop);
  connect(&controller_, &ChatController::busyChanged, this, [this](bool busy) {
    send_->setEnabled(!busy);
    stop_->setEnabled(busy);
  });
  connect(&controller_, &ChatController::status, status_, &QLabel::setText);
  connect(&controller_, &ChatController::failed, this, [this](const QString& error) {
    status_->setText(QStringLiteral("<span style='color:#b00020'><b>%1</b></span>").arg(error.toHtmlEscaped().replace("\n", "<br>")));
  });
  connect(&controller_, &ChatController::streamed, this,
          [this](int side, const QString& text) { answers_[side]->setPlainText(text); });
  connect(&controller_, &ChatController::answered, this, [this](int side, int tokens, double rate) {
    stats_[side]->setText(tr("%1 tokens, %2 tokens/s").arg(tokens).arg(rate, 0, 'f', 1));
  });
}

void ChatPanel::setModels(const QString& base_model, const QString& adapter_dir, const QString& template_name) {
  base_->setText(base_model);
  adapter_->setText(adapter_dir);
  if (!template_name.isEmpty()) template_->setCurrentText(template_name);
}

void ChatPanel::setMaxNewTokens(int n) { max_tokens_->setValue(n); }
void ChatPanel::setQuestion(const QString& question) { question_->setText(question); }
QString ChatPanel::answer(int side) const { return answers_[side]->toPlainText(); }

void ChatPanel::send() {
  if (controller_.isBusy() || question_->text().trimmed().isEmpty()) return;
  if (base_->text().trimmed().isEmpty()) {
    status_->setText(tr("Choose a base model folder first."));
    return;
  }
  for (int side = 0; side < 2; ++side) {
    answers_[side]->clear();
    stats_[side]->clear();
  }
  ChatRequest request;
  request.base_model = base_->text().trimmed();
  request.adapter_dir = adapter_->text().trimmed();
  request.template_name = template_->currentText();
  request.system = system_->text();
  request.question = question_->text().trimmed();
  request.max_new_tokens = max_tokens_->value();
  controller_.ask(request);
}

}  // namespace tandem::ui
