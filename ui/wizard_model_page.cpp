// Wizard page 1: the base model. A Hugging Face folder is inspected as `tandem inspect` does
// (config.json and safetensors headers, no tensor data), and a badge says whether its weights fit
// this machine's RAM and GPU memory together.

#include <QApplication>
#include <QFileDialog>
#include <QLabel>
#include <QLayout>
#include <QLineEdit>
#include <QMenu>
#include <QPushButton>
#include <QTimer>
#include <QToolButton>
#include <QVBoxLayout>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/placement/expert_format.h"
#include "engine/placement/memory_model.h"
#include "engine/placement/placement.h"
#include "ui/error_text.h"
#ifdef TANDEM_UI_WITH_DOWNLOAD
#include "ui/download_dialog.h"
#endif
#include "ui/machine_info.h"
#include "ui/path_field.h"
#include "ui/recent_items.h"
#include "ui/theme.h"
#include "ui/wizard_pages.h"

namespace tandem::ui {

QLabel* makeProblemLabel() {
  auto* label = new QLabel;
  label->setWordWrap(true);
  label->setTextFormat(Qt::PlainText);
  label->setStyleSheet(problemStyleSheet(QApplication::palette()));
  label->setVisible(false);
  return label;
}

QLabel* buddyLabel(const QString& text, QWidget* buddy) {
  auto* label = new QLabel(text);
  label->setBuddy(buddy);
  return label;
}

void showProblem(QLabel* label, const QString& problem) {
  label->setText(problem);
  label->setVisible(!problem.isEmpty());
}

QToolButton* recentMenuButton(const QString& text, const QString& object_name,
                              const std::function<void(QMenu*)>& fill) {
  auto* button = new QToolButton;
  button->setText(text);
  button->setObjectName(object_name);
  button->setToolTip(QObject::tr("What recent runs used (Settings can forget them)"));
  button->setPopupMode(QToolButton::InstantPopup);
  auto* menu = new QMenu(button);
  menu->setObjectName(object_name + QStringLiteral("_menu"));
  // Filled when opened: a run started since the page was built is there too.
  QObject::connect(menu, &QMenu::aboutToShow, menu, [menu, fill] {
    menu->clear();
    fill(menu);
    if (menu->isEmpty()) menu->addAction(QObject::tr("(none yet)"))->setEnabled(false);
  });
  button->setMenu(menu);
  return button;
}

namespace {

// The routed experts' bytes in host memory in the format the checkpoint stores them (held as
// stored) and in the formats experts_format can quantise them to at load (docs/placement.md).
QString expertFormatsText(const io::ModelConfig& c) {
  // fp8 checkpoints are dequantised into bf16 packs (no CPU here multiplies fp8).
  const std::string checkpoint = placement::defaultWeightFormat("auto", c);
  const std::string stored = checkpoint == "fp8" ? "bf16" : checkpoint;
  auto bytes = [&](const std::string& format) {
    uint64_t total = 0;
    for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
      if (c.isMoeLayer(layer)) total += placement::memory::routedExpertBytes(c, format, layer);
    }
    return total;
  };
  QString text = QObject::tr("%1 as %2%3")
                     .arg(bytesText(bytes(stored)), QString::fromStdString(stored),
                          checkpoint == stored ? QObject::tr(" (as stored)")
                                               : QObject::tr(" (from the checkpoint's fp8)"));
  const double stored_bits = placement::expertFormat(stored).bitsPerWeight();
  for (const char* format : {"bf16", "int8", "int4"}) {
    if (format == stored || placement::expertFormat(format).bitsPerWeight() >= stored_bits)
      continue;
    text += QObject::tr(", %1 as %2").arg(bytesText(bytes(format)), QString::fromLatin1(format));
  }
  return text;
}

QString summaryHtml(const io::ModelSummary& s) {
  const io::ModelConfig& c = s.config;
  QString dtypes;
  for (const auto& [dtype, count] : s.dtype_parameters) {
    dtypes += QStringLiteral("%1%2 %3").arg(
        dtypes.isEmpty() ? "" : ", ", QString::fromStdString(dtype),
        QString::fromStdString(formatCount(static_cast<uint64_t>(count))));
  }
  QString experts = QObject::tr("dense (no experts)");
  if (c.isMoe()) {
    experts = QObject::tr("%1 routed experts, %2 per token, in %3 of %4 layers")
                  .arg(c.num_experts)
                  .arg(c.num_experts_per_tok)
                  .arg(s.num_moe_layers)
                  .arg(s.num_layers);
  }
  auto row = [](const QString& k, const QString& v) {
    return QStringLiteral("<tr><td style='padding-right:14px'><b>%1</b></td><td>%2</td></tr>")
        .arg(k, v.toHtmlEscaped());
  };
  return QStringLiteral("<table>") +
         row(QObject::tr("Architecture"),
             QString::fromStdString(std::string(io::architectureName(c.architecture)))) +
         row(QObject::tr("Parameters"),
             QObject::tr("%1 total, %2 active per token")
                 .arg(QString::fromStdString(
                          formatCount(static_cast<uint64_t>(s.parameters.total()))),
                      QString::fromStdString(
                          formatCount(static_cast<uint64_t>(s.active_parameters))))) +
         row(QObject::tr("Experts"), experts) +
         row(QObject::tr("Layers"), QObject::tr("%1, hidden size %2, vocabulary %3")
                                        .arg(c.num_hidden_layers)
                                        .arg(c.hidden_size)
                                        .arg(c.vocab_size)) +
         row(QObject::tr("Weights dtype"), dtypes) +
         (c.isMoe() ? row(QObject::tr("Experts in RAM"), expertFormatsText(c)) : QString()) +
         row(QObject::tr("Size on disk"), QObject::tr("%1 in %2 file(s), %3 tensors")
                                              .arg(bytesText(s.bytes_on_disk))
                                              .arg(s.num_files)
                                              .arg(s.num_tensors)) +
         QStringLiteral("</table>");
}

}  // namespace

ModelPage::ModelPage(FineTuneWizard& wizard) : wizard_(wizard) {
  setTitle(tr("Base model"));
  setSubTitle(
      tr("A Hugging Face model folder (config.json, tokenizer.json and *.safetensors), or a GGUF "
         "file."));
  path_ = new QLineEdit;
  path_->setPlaceholderText(tr("/path/to/Qwen3-30B-A3B"));
  path_->setAccessibleName(tr("Model folder"));
  auto* demo = new QPushButton(tr("Use the &demo model"));
  demo->setToolTip(
      tr("A small random Qwen3-MoE made on this machine (no download), as `tandem demo` uses"));
  QWidget* row = pathField(path_, PathKind::Folder, tr("Model folder"), {}, tr("&Browse…"));
  auto* gguf = new QPushButton(tr("&GGUF file…"));
  gguf->setToolTip(tr("A llama.cpp model file; its weights are dequantised as they load"));
  connect(gguf, &QPushButton::clicked, this, [this] {
    const QString file =
        QFileDialog::getOpenFileName(this, tr("GGUF model"), path_->text(), tr("GGUF (*.gguf)"));
    if (!file.isEmpty()) path_->setText(file);
  });
  row->layout()->addWidget(gguf);
#ifdef TANDEM_UI_WITH_DOWNLOAD
  auto* download = new QPushButton(tr("Do&wnload…"));
  download->setObjectName(QStringLiteral("download_model"));
  download->setToolTip(tr("A model from the Hugging Face Hub, into its cache (docs/download.md)"));
  connect(download, &QPushButton::clicked, this, [this] {
    DownloadDialog dialog(this);
    if (dialog.exec() == QDialog::Accepted)
      path_->setText(QString::fromStdString(dialog.model().string()));
  });
  row->layout()->addWidget(download);
#endif
  row->layout()->addWidget(demo);
  row->layout()->addWidget(
      recentMenuButton(tr("Re&cent"), QStringLiteral("recent_models"), [this](QMenu* menu) {
        for (const QString& model : recentModels())
          connect(menu->addAction(model), &QAction::triggered, path_,
                  [this, model] { path_->setText(model); });
      }));
  summary_ = new QLabel;
  summary_->setObjectName(QStringLiteral("model_summary"));
  summary_->setTextFormat(Qt::RichText);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  badge_ = new QLabel;
  badge_->setTextFormat(Qt::RichText);
  problem_ = makeProblemLabel();
  auto* layout = new QVBoxLayout(this);
  auto* label = new QLabel(tr("&Model folder:"));
  label->setBuddy(path_);
  layout->addWidget(label);
  layout->addWidget(row);
  layout->addWidget(problem_);
  layout->addSpacing(8);
  layout->addWidget(summary_);
  layout->addWidget(badge_);
  layout->addStretch(1);

  path_->setObjectName(QStringLiteral("model_name_or_path"));
  debounce_ = new QTimer(this);
  debounce_->setSingleShot(true);
  debounce_->setInterval(250);
  connect(debounce_, &QTimer::timeout, this, &ModelPage::inspect);
  connect(path_, &QLineEdit::textChanged, debounce_, qOverload<>(&QTimer::start));
  connect(demo, &QPushButton::clicked, this, &ModelPage::useDemoModel);
  connect(&wizard_, &FineTuneWizard::hardwareChanged, this, &ModelPage::showVerdict);
}

void ModelPage::load(const train::TrainConfig& config) {
  path_->setText(QString::fromStdString(config.model_name_or_path));
  inspect();
}

void ModelPage::store(train::TrainConfig& config) const {
  config.model_name_or_path = path_->text().trimmed().toStdString();
}

bool ModelPage::isBusy() const {
  return debounce_->isActive() || !inspector_.isIdle() || !demo_maker_.isIdle();
}

void ModelPage::useDemoModel() {
  showProblem(problem_, {});
  summary_->setText(tr("Making the demo model…"));
  demo_maker_.request([paths = wizard_.paths()] { return demoModel(paths); },
                      [this](EngineResult<std::filesystem::path> model) {
                        summary_->clear();
                        if (model.ok()) {
                          path_->setText(QString::fromStdString(model.value->string()));
                        } else {
                          showProblem(problem_, model.error);
                        }
                      });
}

void ModelPage::inspect() {
  debounce_->stop();
  const QString text = path_->text().trimmed();
  ok_ = false;
  summary_->clear();
  badge_->clear();
  showProblem(problem_, {});  // nothing chosen yet is not an error; Next stays disabled
  wizard_.setModelSummary(std::nullopt);
  if (text.isEmpty()) {
    inspector_.cancel();
  } else {
    summary_->setText(tr("Inspecting %1…").arg(text.toHtmlEscaped()));
    inspector_.request(
        [model = text.toStdString()] { return io::summarizeModel(model); },
        [this](EngineResult<io::ModelSummary> summary) { showSummary(std::move(summary)); });
  }
  emit completeChanged();
}

void ModelPage::showSummary(EngineResult<io::ModelSummary> summary) {
  summary_->clear();
  if (!summary.ok()) {
    showProblem(problem_, summary.error);
    emit completeChanged();
    return;
  }
  summary_->setText(summaryHtml(*summary.value));
  ok_ = true;
  wizard_.setModelSummary(std::move(summary.value));
  showVerdict();
  emit completeChanged();
}

void ModelPage::showVerdict() {
  badge_->clear();
  if (!wizard_.modelSummary()) return;
  if (!wizard_.hasHardware()) {
    badge_->setText(tr("The memory plan waits for the probe of this machine (see Hardware)."));
    return;
  }
  QString verdict;
  bool fits = false;
  try {
    const std::optional<placement::MemoryPlan> plan = wizard_.plan();
    fits = plan && plan->fits;
    verdict = plan && !plan->problems.empty() ? QString::fromStdString(plan->problems.front())
                                              : QString();
  } catch (const Error& e) {
    verdict = errorText(e);
  }
  badge_->setText(QStringLiteral("<span style='background:%1;color:white'>&nbsp;%2&nbsp;</span> %3")
                      .arg(fits ? "#1b7f3b" : "#b00020", fits ? tr("fits") : tr("does not fit"),
                           tr("%1 with the current settings (memory planner). %2")
                               .arg(QString::fromStdString(wizard_.hardware().name).toHtmlEscaped(),
                                    verdict.toHtmlEscaped())));
}

}  // namespace tandem::ui
