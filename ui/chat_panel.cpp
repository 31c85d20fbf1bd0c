#include "ui/chat_panel.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLayout>
#include <QLineEdit>
#include <QPushButton>
#include <QShortcut>
#include <QSpinBox>
#include <QTextBrowser>
#include <QTextCursor>
#include <QVBoxLayout>

#include "engine/chat/chat_template.h"
#include "ui/chat_controller.h"
#include "ui/live_utilisation.h"
#include "ui/path_field.h"
#include "ui/theme.h"

namespace tandem::ui {

ChatPanel::ChatPanel(ChatController& controller, QWidget* parent)
    : QWidget(parent), controller_(controller) {
  base_ = new QLineEdit;
  base_->setPlaceholderText(tr("Hugging Face model folder or GGUF file"));
  adapter_ = new QLineEdit;
  adapter_->setPlaceholderText(tr("LoRA adapter folder (a run's output); empty: base model only"));
  template_ = new QComboBox;
  template_->addItem(tr("(from the model type)"), QString());
  for (const std::string& name : chat::templateNames()) {
    template_->addItem(QString::fromStdString(name), QString::fromStdString(name));
  }
  template_->setToolTip(tr("The chat template the adapter was trained with"));
  system_ = new QLineEdit;
  system_->setPlaceholderText(tr("optional system prompt (the template's default otherwise)"));
  max_tokens_ = new QSpinBox;
  max_tokens_->setRange(1, 8192);
  const infer::GenerationSettings defaults;  // LLaMA-Factory's generating defaults
  max_tokens_->setValue(64);
  max_tokens_->setToolTip(tr("max_new_tokens: the longest answer, in tokens"));
  sample_ = new QCheckBox(tr("S&ample"));
  sample_->setChecked(defaults.do_sample);
  sample_->setToolTip(
      tr("do_sample: draw tokens from the distribution; off = greedy (always the most likely)"));
  auto dspin = [](double lo, double hi, double value, double step, const QString& tip) {
    auto* s = new QDoubleSpinBox;
    s->setRange(lo, hi);
    s->setDecimals(2);
    s->setSingleStep(step);
    s->setValue(value);
    s->setToolTip(tip);
    return s;
  };
  temperature_ = dspin(0.01, 5, defaults.temperature, 0.05,
                       tr("temperature: below 1 sharper, above 1 flatter (default 0.95)"));
  top_p_ = dspin(
      0.01, 1, defaults.top_p, 0.05,
      tr("top_p: sample from the smallest set of tokens with this much probability (default 0.7)"));
  repetition_ = dspin(0.5, 3, defaults.repetition_penalty, 0.05,
                      tr("repetition_penalty: > 1 discourages repeating tokens (default 1.0)"));
  top_k_ = new QSpinBox;
  top_k_->setRange(0, 100000);
  top_k_->setValue(static_cast<int>(defaults.top_k));
  top_k_->setSpecialValueText(tr("off"));
  top_k_->setToolTip(tr("top_k: sample among the k most likely tokens (default 50; 0 = off)"));
  seed_ = new QSpinBox;
  seed_->setRange(0, 2147483647);
  seed_->setSpecialValueText(tr("random"));
  seed_->setToolTip(tr("seed: the same seed gives the same answer; both sides always share one"));
  for (QWidget* w :
       std::initializer_list<QWidget*>{temperature_, top_p_, top_k_, repetition_, seed_}) {
    connect(sample_, &QCheckBox::toggled, w, &QWidget::setEnabled);
  }
  auto* form = new QFormLayout;
  QWidget* base_row = pathField(base_, PathKind::Folder, tr("Base model"));
  auto* gguf = new QPushButton(tr("&GGUF file…"));
  gguf->setToolTip(tr("A llama.cpp model file as the base (docs/gguf.md)"));
  connect(gguf, &QPushButton::clicked, this, [this] {
    const QString file =
        QFileDialog::getOpenFileName(this, tr("GGUF model"), base_->text(), tr("GGUF (*.gguf)"));
    if (!file.isEmpty()) base_->setText(file);
  });
  base_row->layout()->addWidget(gguf);
  form->addRow(tr("&Base model:"), base_row);
  form->addRow(tr("&Adapter:"), pathField(adapter_, PathKind::Folder, tr("Adapter")));
  auto* options = new QHBoxLayout;
  options->addWidget(template_);
  options->addWidget(new QLabel(tr("Max new tokens:")));
  options->addWidget(max_tokens_);
  options->addStretch(1);
  auto* sampling = new QHBoxLayout;
  sampling->addWidget(sample_);
  for (auto [label, widget] : {std::pair<QString, QWidget*>{tr("Temperature:"), temperature_},
                               {tr("Top-p:"), top_p_},
                               {tr("Top-k:"), top_k_},
                               {tr("Repetition penalty:"), repetition_},
                               {tr("Seed:"), seed_}}) {
    sampling->addWidget(new QLabel(label));
    sampling->addWidget(widget);
  }
  sampling->addStretch(1);
  auto* template_label = new QLabel(tr("&Template:"));
  template_label->setBuddy(template_);
  form->addRow(template_label, options);
  form->addRow(tr("S&ystem:"), system_);
  form->addRow(tr("Sampling:"), sampling);

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
  new_chat_ = new QPushButton(tr("&New chat"));
  new_chat_->setToolTip(tr("Forget the conversation: the next message starts a new one"));
  auto* ask = new QHBoxLayout;
  ask->addWidget(question_, 1);
  ask->addWidget(send_);
  ask->addWidget(stop_);
  ask->addWidget(new_chat_);

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(form);
  layout->addLayout(answers, 1);
  layout->addLayout(ask);
  layout->addWidget(status_);
  layout->addWidget(new LiveUtilisation);

  connect(send_, &QPushButton::clicked, this, &ChatPanel::send);
  connect(question_, &QLineEdit::returnPressed, this, &ChatPanel::send);
  connect(stop_, &QPushButton::clicked, &controller_, &ChatController::stop);
  connect(new_chat_, &QPushButton::clicked, this, &ChatPanel::newChat);
  connect(&controller_, &ChatController::busyChanged, this, [this](bool busy) {
    send_->setEnabled(!busy);
    stop_->setEnabled(busy);
    new_chat_->setEnabled(!busy);
    if (!busy) finishTurn();
  });
  connect(&controller_, &ChatController::status, status_, &QLabel::setText);
  connect(&controller_, &ChatController::failed, this, [this](const QString& error) {
    failed_ = true;
    status_->setText(
        QStringLiteral("<span style='color:%1'><b>%2</b></span>")
            .arg(problemColor(palette()).name(), error.toHtmlEscaped().replace("\n", "<br>")));
  });
  connect(&controller_, &ChatController::streamed, this, [this](int side, const QString& text) {
    current_[side] = text;
    render(side);
  });
  connect(
      &controller_, &ChatController::answered, this,
      [this](int side, const QString& reason, int tokens, double rate) {
        stats_[side]->setText(
            tr("%1 tokens, %2 tokens/s, ended: %3").arg(tokens).arg(rate, 0, 'f', 1).arg(reason));
      });
}

void ChatPanel::setModels(const QString& base_model, const QString& adapter_dir,
                          const QString& template_name) {
  base_->setText(base_model);
  adapter_->setText(adapter_dir);
  const int i = template_->findData(template_name);
  template_->setCurrentIndex(i >= 0 ? i : 0);
}

void ChatPanel::setMaxNewTokens(int n) { max_tokens_->setValue(n); }
void ChatPanel::setQuestion(const QString& question) { question_->setText(question); }

void ChatPanel::setSampling(bool sample, uint64_t seed) {
  sample_->setChecked(sample);
  seed_->setValue(static_cast<int>(seed));
}
QString ChatPanel::answer(int side) const { return current_[side]; }

void ChatPanel::newChat() {
  if (controller_.isBusy()) return;
  for (int side = 0; side < 2; ++side) {
    history_[side].clear();
    current_[side].clear();
    answers_[side]->clear();
    stats_[side]->clear();
  }
  pending_.clear();
  status_->clear();
}

// The conversation of one side: every exchange, then the question being answered.
void ChatPanel::render(int side) {
  auto paragraph = [](const QString& text) {
    return QStringLiteral("<p>%1</p>").arg(text.toHtmlEscaped().replace("\n", "<br>"));
  };
  QString html;
  for (const ChatTurn& turn : history_[side]) {
    html += QStringLiteral("<p><b>%1</b> %2</p>")
                .arg(tr("You:"), turn.user.toHtmlEscaped().replace("\n", "<br>")) +
            paragraph(turn.assistant);
  }
  if (!pending_.isEmpty()) {
    html += QStringLiteral("<p><b>%1</b> %2</p>")
                .arg(tr("You:"), pending_.toHtmlEscaped().replace("\n", "<br>")) +
            paragraph(current_[side]);
  }
  answers_[side]->setHtml(html);
  answers_[side]->moveCursor(QTextCursor::End);
}

// Keeps the exchange that just ended (a stopped answer as far as it got, like the other chat
// apps); a failed one is dropped.
void ChatPanel::finishTurn() {
  if (pending_.isEmpty()) return;
  if (!failed_) {
    for (int side = 0; side < 2; ++side) {
      if (side == 1 && adapter_->text().trimmed().isEmpty()) continue;
      history_[side].push_back({pending_, current_[side]});
    }
  }
  pending_.clear();
  for (int side = 0; side < 2; ++side) render(side);
}

void ChatPanel::send() {
  if (controller_.isBusy() || question_->text().trimmed().isEmpty()) return;
  if (base_->text().trimmed().isEmpty()) {
    status_->setText(tr("Choose a base model folder first."));
    return;
  }
  ChatQuestion q;
  q.base_model = base_->text().trimmed();
  q.adapter_dir = adapter_->text().trimmed();
  q.template_name = template_->currentData().toString();
  q.system = system_->text();
  q.question = question_->text().trimmed();
  // Another model, adapter or template starts a new conversation.
  const QString models = q.base_model + QChar(0) + q.adapter_dir + QChar(0) + q.template_name;
  if (models != conversation_models_) newChat();
  conversation_models_ = models;
  for (int side = 0; side < 2; ++side) {
    q.history[side] = history_[side];
    current_[side].clear();
    stats_[side]->clear();
  }
  pending_ = q.question;
  failed_ = false;
  for (int side = 0; side < 2; ++side) render(side);
  question_->clear();
  q.settings.max_new_tokens = max_tokens_->value();
  q.settings.do_sample = sample_->isChecked();
  q.settings.temperature = temperature_->value();
  q.settings.top_p = top_p_->value();
  q.settings.top_k = top_k_->value();
  q.settings.repetition_penalty = repetition_->value();
  if (seed_->value() > 0) q.settings.seed = static_cast<uint64_t>(seed_->value());
  controller_.ask(q);
}

}  // namespace tandem::ui
