// Wizard page 4: LoRA and training settings. Every field is a LLaMA-Factory key with its default
// (and transformers' TrainingArguments default underneath), named in its tooltip.

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QDoubleValidator>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QSpinBox>
#include <QVBoxLayout>

#include "ui/path_field.h"
#include "ui/wizard_pages.h"

namespace tandem::ui {

namespace {

QSpinBox* spin(int lo, int hi, const QString& tip) {
  auto* s = new QSpinBox;
  s->setRange(lo, hi);
  s->setToolTip(tip);
  return s;
}

QDoubleSpinBox* dspin(double lo, double hi, int decimals, double step, const QString& tip) {
  auto* s = new QDoubleSpinBox;
  s->setRange(lo, hi);
  s->setDecimals(decimals);
  s->setSingleStep(step);
  s->setToolTip(tip);
  return s;
}

QCheckBox* checkBox(const QString& text, const QString& tip) {
  auto* c = new QCheckBox(text);
  c->setToolTip(tip);
  return c;
}

// Shortest text that reads back to the same double (3e-3 -> "0.003", not 0.0030000000000000001).
QString numberText(double v) {
  for (int precision = 1; precision < 17; ++precision) {
    const QString text = QString::number(v, 'g', precision);
    if (QLocale::c().toDouble(text) == v) return text;
  }
  return QString::number(v, 'g', 17);
}

}  // namespace

TrainingPage::TrainingPage(FineTuneWizard&) {
  setTitle(tr("LoRA and training"));
  setSubTitle(tr("LLaMA-Factory's keys and defaults; hover a field for its key and meaning."));
  rank_ = spin(1, 4096, tr("lora_rank: the rank r of the LoRA matrices (default 8)"));
  alpha_ = spin(1, 1 << 20, tr("lora_alpha: scale alpha/r of the LoRA update (default 2 × rank)"));
  dropout_ = dspin(0, 0.99, 3, 0.05, tr("lora_dropout: dropout on the LoRA input (default 0)"));
  target_ = new QLineEdit;
  target_->setToolTip(
      tr("lora_target: 'all' or module names, comma-separated (q_proj,v_proj,gate_proj,…)"));
  rslora_ = checkBox(tr("rs&LoRA"),
                     tr("use_rslora: scale alpha/sqrt(r) instead of alpha/r (default off)"));
  lr_ = new QLineEdit;
  auto* lr_validator = new QDoubleValidator(0, 10, 12, lr_);
  lr_validator->setNotation(QDoubleValidator::ScientificNotation);
  lr_validator->setLocale(QLocale::c());
  lr_->setValidator(lr_validator);
  lr_->setToolTip(
      tr("learning_rate: AdamW peak learning rate (default 5e-5; LoRA usually 1e-4 … 3e-3)"));
  epochs_ = dspin(0, 1e6, 2, 1, tr("num_train_epochs: passes over the data (default 3)"));
  max_steps_ = spin(-1, 1 << 30,
                    tr("max_steps: optimizer steps; > 0 overrides the epochs (default -1 = off)"));
  max_steps_->setSpecialValueText(tr("from epochs"));
  batch_ = spin(1, 1 << 16, tr("per_device_train_batch_size: samples per micro-batch (default 8)"));
  accumulation_ = spin(
      1, 1 << 16, tr("gradient_accumulation_steps: micro-batches per optimizer step (default 1)"));
  scheduler_ = new QComboBox;
  for (auto t : {train::LrSchedulerType::Linear, train::LrSchedulerType::Cosine,
                 train::LrSchedulerType::Constant, train::LrSchedulerType::ConstantWithWarmup}) {
    scheduler_->addItem(QString::fromLatin1(train::lrSchedulerName(t).data(),
                                            static_cast<int>(train::lrSchedulerName(t).size())),
                        static_cast<int>(t));
  }
  scheduler_->setToolTip(
      tr("lr_scheduler_type: learning-rate schedule after warmup (default linear)"));
  warmup_ = dspin(0, 0.999, 3, 0.01,
                  tr("warmup_ratio: fraction of the steps spent warming up (default 0)"));
  grad_clip_ = dspin(0, 1e6, 3, 0.1,
                     tr("max_grad_norm: clip the global gradient norm (default 1.0; 0 = off)"));
  weight_decay_ =
      dspin(0, 10, 4, 0.01, tr("weight_decay: AdamW decoupled weight decay (default 0)"));
  seed_ = spin(0, 2147483647, tr("seed: data order, LoRA init and dropout (default 42)"));
  bf16_ =
      checkBox(tr("&bf16"), tr("bf16: compute the dense part in bfloat16 (default off = fp32)"));
  checkpointing_ = checkBox(tr("&Gradient checkpointing"),
                            tr("recompute activations in backward to save memory (default on; "
                               "key disable_gradient_checkpointing)"));
  logging_ =
      spin(1, 1 << 30, tr("logging_steps: steps between log lines (default 500; examples use 10)"));
  save_steps_ = spin(1, 1 << 30, tr("save_steps: steps between checkpoints (default 500)"));
  save_limit_ = spin(0, 1 << 20, tr("save_total_limit: checkpoints kept (default: all)"));
  save_limit_->setSpecialValueText(tr("keep all"));
  output_ = new QLineEdit;
  output_->setToolTip(tr("output_dir: where checkpoints and the final adapter go"));
  overwrite_ =
      checkBox(tr("&Overwrite"),
               tr("overwrite_output_dir: start over in a folder that holds an earlier Tandem run"));
  plot_ =
      checkBox(tr("Plot &loss"), tr("plot_loss: write training_loss.png at the end (default off)"));

  rank_->setObjectName(QStringLiteral("lora_rank"));
  alpha_->setObjectName(QStringLiteral("lora_alpha"));
  dropout_->setObjectName(QStringLiteral("lora_dropout"));
  target_->setObjectName(QStringLiteral("lora_target"));
  rslora_->setObjectName(QStringLiteral("use_rslora"));
  lr_->setObjectName(QStringLiteral("learning_rate"));
  epochs_->setObjectName(QStringLiteral("num_train_epochs"));
  max_steps_->setObjectName(QStringLiteral("max_steps"));
  batch_->setObjectName(QStringLiteral("per_device_train_batch_size"));
  accumulation_->setObjectName(QStringLiteral("gradient_accumulation_steps"));
  scheduler_->setObjectName(QStringLiteral("lr_scheduler_type"));
  warmup_->setObjectName(QStringLiteral("warmup_ratio"));
  grad_clip_->setObjectName(QStringLiteral("max_grad_norm"));
  weight_decay_->setObjectName(QStringLiteral("weight_decay"));
  seed_->setObjectName(QStringLiteral("seed"));
  bf16_->setObjectName(QStringLiteral("bf16"));
  checkpointing_->setObjectName(QStringLiteral("gradient_checkpointing"));
  logging_->setObjectName(QStringLiteral("logging_steps"));
  save_steps_->setObjectName(QStringLiteral("save_steps"));
  save_limit_->setObjectName(QStringLiteral("save_total_limit"));
  output_->setObjectName(QStringLiteral("output_dir"));
  overwrite_->setObjectName(QStringLiteral("overwrite_output_dir"));
  plot_->setObjectName(QStringLiteral("plot_loss"));
  auto* lora = new QGroupBox(tr("LoRA"));
  auto* lora_form = new QFormLayout(lora);
  lora_form->addRow(tr("&Rank:"), rank_);
  lora_form->addRow(tr("&Alpha:"), alpha_);
  lora_form->addRow(tr("&Dropout:"), dropout_);
  lora_form->addRow(tr("&Target modules:"), target_);
  lora_form->addRow(QString(), rslora_);
  auto* optim = new QGroupBox(tr("Optimisation"));
  auto* optim_form = new QFormLayout(optim);
  optim_form->addRow(tr("Learning &rate:"), lr_);
  optim_form->addRow(tr("&Epochs:"), epochs_);
  optim_form->addRow(tr("&Max steps:"), max_steps_);
  optim_form->addRow(tr("Batch si&ze:"), batch_);
  optim_form->addRow(tr("Gradient a&ccumulation:"), accumulation_);
  optim_form->addRow(tr("Sc&hedule:"), scheduler_);
  optim_form->addRow(tr("&Warmup ratio:"), warmup_);
  optim_form->addRow(tr("Max gradient &norm:"), grad_clip_);
  optim_form->addRow(tr("Weight deca&y:"), weight_decay_);
  optim_form->addRow(tr("S&eed:"), seed_);
  auto* precision = new QHBoxLayout;
  precision->addWidget(bf16_);
  precision->addWidget(checkpointing_);
  optim_form->addRow(QString(), precision);
  auto* output = new QGroupBox(tr("Output"));
  auto* output_form = new QFormLayout(output);
  output_form->addRow(
      buddyLabel(tr("Output &folder:"), output_),
      pathField(output_, PathKind::Folder, tr("Output folder"), {}, tr("Bro&wse…")));
  auto* flags = new QHBoxLayout;
  flags->addWidget(overwrite_);
  flags->addWidget(plot_);
  output_form->addRow(QString(), flags);
  output_form->addRow(tr("Lo&gging steps:"), logging_);
  output_form->addRow(tr("&Save steps:"), save_steps_);
  output_form->addRow(tr("Checkpoints &kept:"), save_limit_);

  problem_ = makeProblemLabel();
  auto* columns = new QHBoxLayout;
  auto* left = new QVBoxLayout;
  left->addWidget(lora);
  left->addWidget(output);
  left->addStretch(1);
  columns->addLayout(left, 1);
  columns->addWidget(optim, 1);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(columns);
  layout->addWidget(problem_);
  connect(lr_, &QLineEdit::textChanged, this, &TrainingPage::check);
  connect(output_, &QLineEdit::textChanged, this, &TrainingPage::check);
  connect(target_, &QLineEdit::textChanged, this, &TrainingPage::check);
}

void TrainingPage::load(const train::TrainConfig& c) {
  rank_->setValue(static_cast<int>(c.lora_rank));
  alpha_->setValue(static_cast<int>(c.lora_alpha));
  dropout_->setValue(c.lora_dropout);
  QStringList targets;
  for (const std::string& t : c.lora_target) targets << QString::fromStdString(t);
  target_->setText(targets.join(QLatin1Char(',')));
  rslora_->setChecked(c.use_rslora);
  lr_->setText(numberText(c.learning_rate));
  epochs_->setValue(c.num_train_epochs);
  max_steps_->setValue(static_cast<int>(c.max_steps));
  batch_->setValue(static_cast<int>(c.per_device_train_batch_size));
  accumulation_->setValue(static_cast<int>(c.gradient_accumulation_steps));
  scheduler_->setCurrentIndex(scheduler_->findData(static_cast<int>(c.lr_scheduler_type)));
  warmup_->setValue(c.warmup_ratio);
  grad_clip_->setValue(c.max_grad_norm);
  weight_decay_->setValue(c.weight_decay);
  seed_->setValue(static_cast<int>(c.seed));
  bf16_->setChecked(c.bf16);
  checkpointing_->setChecked(c.gradient_checkpointing);
  logging_->setValue(static_cast<int>(c.logging_steps));
  save_steps_->setValue(static_cast<int>(c.save_steps));
  save_limit_->setValue(static_cast<int>(c.save_total_limit.value_or(0)));
  output_->setText(QString::fromStdString(c.output_dir.string()));
  overwrite_->setChecked(c.overwrite_output_dir);
  plot_->setChecked(c.plot_loss);
  check();
}

void TrainingPage::store(train::TrainConfig& c) const {
  c.lora_rank = rank_->value();
  c.lora_alpha = alpha_->value();
  c.lora_dropout = dropout_->value();
  c.lora_target.clear();
  for (const QString& t : target_->text().split(QLatin1Char(','), Qt::SkipEmptyParts))
    c.lora_target.push_back(t.trimmed().toStdString());
  c.use_rslora = rslora_->isChecked();
  c.learning_rate = QLocale::c().toDouble(lr_->text());
  c.num_train_epochs = epochs_->value();
  c.max_steps = max_steps_->value() == 0 ? -1 : max_steps_->value();
  c.per_device_train_batch_size = batch_->value();
  c.gradient_accumulation_steps = accumulation_->value();
  c.lr_scheduler_type = static_cast<train::LrSchedulerType>(scheduler_->currentData().toInt());
  c.warmup_ratio = warmup_->value();
  c.max_grad_norm = grad_clip_->value();
  c.weight_decay = weight_decay_->value();
  c.seed = seed_->value();
  c.bf16 = bf16_->isChecked();
  c.gradient_checkpointing = checkpointing_->isChecked();
  c.logging_steps = logging_->value();
  c.save_steps = save_steps_->value();
  c.save_total_limit =
      save_limit_->value() > 0 ? std::optional<int64_t>(save_limit_->value()) : std::nullopt;
  c.output_dir = output_->text().trimmed().toStdString();
  c.overwrite_output_dir = overwrite_->isChecked();
  c.plot_loss = plot_->isChecked();
}

void TrainingPage::check() {
  QString problem;
  bool ok_lr = false;
  const double lr = QLocale::c().toDouble(lr_->text(), &ok_lr);
  if (!ok_lr || lr <= 0)
    problem = tr("Learning rate must be a positive number, e.g. 1e-4.");
  else if (target_->text().trimmed().isEmpty())
    problem = tr("Name the LoRA target modules, or 'all'.");
  else if (output_->text().trimmed().isEmpty())
    problem = tr("Choose an output folder for checkpoints and the adapter.");
  showProblem(problem_, problem);
  emit completeChanged();
}

bool TrainingPage::isComplete() const { return problem_->text().isEmpty(); }

}  // namespace tandem::ui
