// Wizard page 3: the dataset. A dataset_info.json entry (or a plain .json/.jsonl/.csv file), read
// as LLaMA-Factory reads it; a preview table; one sample rendered by the chat template and
// tokenised, trained tokens on green and masked (label -100) ones in grey; skipped rows and why.

#include <QCheckBox>
#include <QComboBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFile>
#include <QFileDialog>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QPushButton>
#include <QSpinBox>
#include <QSplitter>
#include <QTableWidget>
#include <QTextBrowser>
#include <QTimer>
#include <QToolButton>
#include <QVBoxLayout>

#include "engine/chat/chat_template.h"
#include "engine/core/error.h"
#include "ui/dataset_preview.h"
#include "ui/error_text.h"
#include "ui/path_field.h"
#include "ui/recent_items.h"
#include "ui/tokenizer_cache.h"
#include "ui/wizard_pages.h"

namespace tandem::ui {

namespace {

QString lastTurn(const chat::Conversation& c, chat::Role role) {
  for (auto it = c.messages.rbegin(); it != c.messages.rend(); ++it) {
    if (it->role == role) return QString::fromStdString(it->content);
  }
  return {};
}

QString oneLine(QString text) { return text.replace(QLatin1Char('\n'), QStringLiteral(" ⏎ ")); }

}  // namespace

DatasetPage::DatasetPage(FineTuneWizard& wizard)
    : wizard_(wizard), tokenizers_(std::make_shared<TokenizerCache>()) {
  setTitle(tr("Dataset and template"));
  setSubTitle(
      tr("LLaMA-Factory data: a name from dataset_info.json in the dataset folder, or a "
         ".json/.jsonl/.csv file."));
  dir_ = new QLineEdit;
  dir_->setToolTip(tr("dataset_dir: the folder with dataset_info.json"));
  dataset_ = new QComboBox;
  dataset_->setEditable(true);
  dataset_->setToolTip(
      tr("dataset: names from dataset_info.json, comma-separated, or a file path"));
  auto* browse_file = new QPushButton(tr("&File…"));
  template_ = new QComboBox;
  for (const std::string& name : chat::templateNames())
    template_->addItem(QString::fromStdString(name));
  template_->setToolTip(
      tr("template: the chat template the model was trained with (qwen3, llama3, deepseek3, …)"));
  cutoff_ = new QSpinBox;
  cutoff_->setRange(1, 1 << 20);
  cutoff_->setToolTip(
      tr("cutoff_len: tokens per sample after truncation (LLaMA-Factory default 2048)"));
  max_samples_ = new QSpinBox;
  max_samples_->setRange(0, 1 << 30);
  max_samples_->setSpecialValueText(tr("all"));
  max_samples_->setToolTip(tr("max_samples: the first N records of each dataset; all by default"));
  val_size_ = new QDoubleSpinBox;
  val_size_->setRange(0, 1e9);
  val_size_->setDecimals(3);
  val_size_->setToolTip(
      tr("val_size: a fraction (< 1) or a count of samples held out for evaluation"));
  train_on_prompt_ = new QCheckBox(tr("Train on &prompt"));
  train_on_prompt_->setToolTip(
      tr("train_on_prompt: compute the loss on the prompt tokens too (default off)"));
  mask_history_ = new QCheckBox(tr("Mask &history"));
  mask_history_->setToolTip(
      tr("mask_history: train on the last turn of a conversation only (default off)"));
  packing_ = new QCheckBox(tr("P&acking"));
  packing_->setToolTip(
      tr("packing: concatenate samples into cutoff_len rows (default off for SFT)"));
  neat_packing_ = new QCheckBox(tr("Neat pac&king"));
  neat_packing_->setToolTip(
      tr("neat_packing: packed samples do not attend to each other and their positions restart "
         "at 0, so each trains as it would alone (turns packing on)"));
  // LLaMA-Factory: neat_packing implies packing; unpacking drops the neat variant with it.
  connect(neat_packing_, &QCheckBox::toggled, packing_, [this](bool neat) {
    if (neat) packing_->setChecked(true);
  });
  connect(packing_, &QCheckBox::toggled, neat_packing_, [this](bool packing) {
    if (!packing) neat_packing_->setChecked(false);
  });

  dir_->setObjectName(QStringLiteral("dataset_dir"));
  dataset_->setObjectName(QStringLiteral("dataset"));
  template_->setObjectName(QStringLiteral("template"));
  cutoff_->setObjectName(QStringLiteral("cutoff_len"));
  max_samples_->setObjectName(QStringLiteral("max_samples"));
  val_size_->setObjectName(QStringLiteral("val_size"));
  train_on_prompt_->setObjectName(QStringLiteral("train_on_prompt"));
  mask_history_->setObjectName(QStringLiteral("mask_history"));
  packing_->setObjectName(QStringLiteral("packing"));
  neat_packing_->setObjectName(QStringLiteral("neat_packing"));
  auto* dataset_row = new QHBoxLayout;
  dataset_row->addWidget(dataset_, 1);
  dataset_row->addWidget(browse_file);
  dataset_row->addWidget(
      recentMenuButton(tr("Rec&ent"), QStringLiteral("recent_datasets"), [this](QMenu* menu) {
        for (const RecentDataset& recent : recentDatasets()) {
          connect(menu->addAction(recent.label()), &QAction::triggered, dataset_, [this, recent] {
            dir_->setText(recent.dir);
            dataset_->setCurrentText(recent.dataset);
          });
        }
      }));
  auto* checks = new QHBoxLayout;
  checks->addWidget(train_on_prompt_);
  checks->addWidget(mask_history_);
  checks->addWidget(packing_);
  checks->addWidget(neat_packing_);
  checks->addStretch(1);
  auto* form = new QFormLayout;
  form->addRow(buddyLabel(tr("Dataset &folder:"), dir_),
               pathField(dir_, PathKind::Folder, tr("Dataset folder"), {}, tr("B&rowse…")));
  form->addRow(buddyLabel(tr("Data&set:"), dataset_), dataset_row);
  form->addRow(tr("&Template:"), template_);
  auto* numbers = new QHBoxLayout;
  numbers->addWidget(new QLabel(tr("Cutoff:")));
  numbers->addWidget(cutoff_);
  numbers->addWidget(new QLabel(tr("Max samples:")));
  numbers->addWidget(max_samples_);
  numbers->addWidget(new QLabel(tr("Validation:")));
  numbers->addWidget(val_size_);
  numbers->addStretch(1);
  form->addRow(tr("Lengths:"), numbers);
  form->addRow(QString(), checks);

  table_ = new QTableWidget(0, 3);
  table_->setHorizontalHeaderLabels(
      {tr("System"), tr("Prompt (last user turn)"), tr("Response (trained)")});
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setAccessibleName(tr("Dataset preview"));
  rendered_ = new QTextBrowser;
  rendered_->setAccessibleName(tr("Rendered sample"));
  skipped_ = new QLabel;
  skipped_->setWordWrap(true);
  problem_ = makeProblemLabel();
  auto* split = new QSplitter(Qt::Vertical);
  split->addWidget(table_);
  auto* render_box = new QWidget;
  auto* render_layout = new QVBoxLayout(render_box);
  render_layout->setContentsMargins(0, 0, 0, 0);
  render_layout->addWidget(new QLabel(
      tr("Selected row as the model sees it: <span style='background:%1'>&nbsp;trained "
         "tokens&nbsp;</span> "
         "<span style='background:%2;color:#444'>&nbsp;masked tokens (label −100)&nbsp;</span>; "
         "neighbouring tokens alternate in shade.")
          .arg(kTrainedShades[0], kMaskedShades[0])));
  render_layout->addWidget(rendered_);
  split->addWidget(render_box);

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(form);
  layout->addWidget(problem_);
  layout->addWidget(skipped_);
  layout->addWidget(split, 1);

  debounce_ = new QTimer(this);
  debounce_->setSingleShot(true);
  debounce_->setInterval(300);
  connect(debounce_, &QTimer::timeout, this, &DatasetPage::refresh);
  auto later = [this] { debounce_->start(); };
  connect(dir_, &QLineEdit::textChanged, this, [this, later] {
    listDatasets();
    later();
  });
  connect(dataset_, &QComboBox::currentTextChanged, this, later);
  connect(template_, &QComboBox::currentTextChanged, this, later);
  connect(cutoff_, &QSpinBox::valueChanged, this, later);
  connect(max_samples_, &QSpinBox::valueChanged, this, later);
  connect(train_on_prompt_, &QCheckBox::toggled, this, later);
  connect(mask_history_, &QCheckBox::toggled, this, later);
  connect(table_, &QTableWidget::currentCellChanged, this, [this](int row) { renderRow(row); });
  connect(browse_file, &QPushButton::clicked, this, [this] {
    const QString file = QFileDialog::getOpenFileName(this, tr("Dataset file"), dir_->text(),
                                                      tr("Data (*.json *.jsonl *.csv)"));
    if (!file.isEmpty()) dataset_->setCurrentText(file);
  });
}

void DatasetPage::listDatasets() {
  const QString current = dataset_->currentText();
  const QSignalBlocker block(dataset_);
  dataset_->clear();
  QFile info(QDir(dir_->text()).filePath(QStringLiteral("dataset_info.json")));
  if (info.open(QIODevice::ReadOnly)) {
    const QJsonObject entries = QJsonDocument::fromJson(info.readAll()).object();
    for (auto it = entries.begin(); it != entries.end(); ++it) dataset_->addItem(it.key());
  }
  dataset_->setCurrentText(current);
}

void DatasetPage::load(const train::TrainConfig& config) {
  const QSignalBlocker b1(dir_), b2(dataset_), b3(template_), b4(cutoff_), b5(max_samples_),
      b6(train_on_prompt_), b7(mask_history_);
  dir_->setText(QString::fromStdString(config.dataset_dir));
  listDatasets();
  QStringList names;
  for (const std::string& n : config.dataset) names << QString::fromStdString(n);
  dataset_->setCurrentText(names.join(QLatin1Char(',')));
  template_->setCurrentText(QString::fromStdString(config.template_name));
  cutoff_->setValue(static_cast<int>(config.cutoff_len));
  max_samples_->setValue(static_cast<int>(config.max_samples.value_or(0)));
  val_size_->setValue(config.val_size);
  train_on_prompt_->setChecked(config.train_on_prompt);
  mask_history_->setChecked(config.mask_history);
  packing_->setChecked(config.packing || config.neat_packing);
  neat_packing_->setChecked(config.neat_packing);
  ok_ = false;
}

void DatasetPage::store(train::TrainConfig& config) const {
  config.dataset_dir = dir_->text().trimmed().toStdString();
  config.dataset = train::splitDatasetNames(dataset_->currentText().toStdString());
  config.template_name = template_->currentText().toStdString();
  config.cutoff_len = cutoff_->value();
  config.max_samples =
      max_samples_->value() > 0 ? std::optional<int64_t>(max_samples_->value()) : std::nullopt;
  config.val_size = val_size_->value();
  config.train_on_prompt = train_on_prompt_->isChecked();
  config.mask_history = mask_history_->isChecked();
  config.packing = packing_->isChecked();
  config.neat_packing = neat_packing_->isChecked();
}

void DatasetPage::initializePage() { refresh(); }

bool DatasetPage::isBusy() const {
  return debounce_->isActive() || !data_worker_.isIdle() || !render_worker_.isIdle();
}

int DatasetPage::previewRows() const { return table_->rowCount(); }
QString DatasetPage::renderedHtml() const { return rendered_->toHtml(); }
QString DatasetPage::skippedText() const { return skipped_->text(); }

void DatasetPage::refresh() {
  debounce_->stop();
  ok_ = false;
  rows_.clear();
  table_->setRowCount(0);
  renderRow(-1);
  showProblem(problem_, {});
  train::TrainConfig config;
  store(config);
  skipped_->setText(tr("Reading the data…"));
  data_worker_.request(
      [config] { return loadDatasetPreview(config); },
      [this](EngineResult<DatasetPreview> preview) { showPreview(std::move(preview)); });
  emit completeChanged();
}

void DatasetPage::showPreview(EngineResult<DatasetPreview> preview) {
  skipped_->clear();
  if (!preview.ok()) {
    showProblem(problem_, preview.error);
    emit completeChanged();
    return;
  }
  rows_ = std::move(preview.value->first_rows);
  skipped_->setText(datasetReportText(preview.value->report));
  const int shown = static_cast<int>(rows_.size());
  table_->setRowCount(shown);
  bool any_system = false;
  for (int i = 0; i < shown; ++i) {
    const chat::Conversation& c = rows_[i];
    table_->setItem(i, 0, new QTableWidgetItem(oneLine(QString::fromStdString(c.system))));
    any_system = any_system || !c.system.empty();
    table_->setItem(i, 1, new QTableWidgetItem(oneLine(lastTurn(c, chat::Role::User))));
    table_->setItem(i, 2, new QTableWidgetItem(oneLine(lastTurn(c, chat::Role::Assistant))));
  }
  table_->setColumnHidden(0, !any_system);  // an empty column would take a third of the width
  try {
    // An unknown name is the page's problem.
    chat::templateByName(template_->currentText().toStdString());
    ok_ = true;
  } catch (const Error& e) {
    showProblem(problem_, errorText(e));
  }
  if (ok_) {
    if (shown > 0) table_->selectRow(0);
    renderRow(0);
  }
  emit completeChanged();
}

void DatasetPage::renderRow(int row) {
  rendered_->clear();
  if (row < 0 || row >= static_cast<int>(rows_.size())) {
    render_worker_.cancel();
    rendered_->setPlaceholderText({});
    return;
  }
  train::TrainConfig config;
  store(config);
  chat::SupervisedOptions options;
  options.cutoff_len = config.cutoff_len;
  options.train_on_prompt = config.train_on_prompt;
  options.mask_history = config.mask_history;
  rendered_->setPlaceholderText(tr("Tokenising with the model's tokenizer…"));
  render_worker_.request(
      [tokenizers = tokenizers_, model = wizard_.config().model_name_or_path, sample = rows_[row],
       template_name = config.template_name,
       options] { return sampleHtml(tokenizers->get(model), sample, template_name, options); },
      [this](EngineResult<QString> html) {
        rendered_->setPlaceholderText({});
        if (html.ok()) {
          rendered_->setHtml(*html.value);
        } else {
          rendered_->setPlainText(
              tr("Cannot render with this model's tokenizer: %1").arg(html.error));
        }
      });
}

}  // namespace tandem::ui
