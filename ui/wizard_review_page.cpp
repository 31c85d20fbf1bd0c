// Wizard page 5: review. What will run (model, data, device), the memory plan per device, the
// warnings, and the equivalent YAML, checked by the same parser `tandem train` uses. Save it, or
// copy the `tandem train` command that runs it without the studio.

#include <QApplication>
#include <QClipboard>
#include <QDir>
#include <QFileDialog>
#include <QFontDatabase>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSaveFile>
#include <QSplitter>
#include <QVBoxLayout>
#include <filesystem>

#include "engine/core/error.h"
#include "ui/error_text.h"
#include "ui/machine_info.h"
#include "ui/memory_map.h"
#include "ui/wizard_pages.h"

namespace tandem::ui {

namespace {

// Weights by device, as Tandem places them by default: routed experts in RAM for the CPU expert
// engine, everything else on the dense-part device. LoRA, optimizer and activations are the
// memory planner's part (engine/placement) and are not guessed here.
std::vector<MemoryBar> plannedWeightBars(const MachineInfo& machine, const model::ModelSummary& summary,
                                         const train::TrainConfig& config) {
  const uint64_t bytes_per_param = config.bf16 ? 2 : 4;
  const uint64_t routed = static_cast<uint64_t>(summary.parameters[model::ParamCategory::RoutedExperts]) * bytes_per_param;
  const uint64_t rest = static_cast<uint64_t>(summary.parameters.total()) * bytes_per_param - routed;
  const bool on_gpu = !machine.torch.gpus.empty() && config.device != "cpu";
  std::vector<MemoryBar> bars;
  if (on_gpu) {
    const int index = config.device.rfind("cuda:", 0) == 0 ? std::stoi(config.device.substr(5)) : 0;
    for (const gpu::GpuInfo& g : machine.torch.gpus) {
      MemoryBar bar;
      bar.device = QStringLiteral("cuda:%1").arg(g.index);
      bar.label = QStringLiteral("GPU %1").arg(g.index);
      bar.capacity_bytes = g.total_bytes;
      bar.bytes[static_cast<int>(MemorySlice::Other)] = g.total_bytes - std::min(g.total_bytes, g.free_bytes);
      if (g.index == index) bar.bytes[static_cast<int>(MemorySlice::Weights)] = rest;
      bars.push_back(bar);
    }
  }
  MemoryBar ram;
  ram.device = QStringLiteral("cpu");
  ram.label = QObject::tr("RAM");
  ram.capacity_bytes = machine.totalRamBytes();
  uint64_t ram_free = 0;
  for (const NumaNode& n : detectNumaTopology().nodes) ram_free += n.free_bytes;
  ram.bytes[static_cast<int>(MemorySlice::Other)] = ram.capacity_bytes - std::min(ram.capacity_bytes, ram_free);
  ram.bytes[static_cast<int>(MemorySlice::Weights)] = routed + (on_gpu ? 0 : rest);
  bars.push_back(ram);
  for (MemoryBar& bar : bars) {
    const uint64_t used = bar.used();
    bar.bytes[static_cast<int>(MemorySlice::Free)] = bar.capacity_bytes > used ? bar.capacity_bytes - used : 0;
  }
  return bars;
}

}  // namespace

ReviewPage::ReviewPage(FineTuneWizard& wizard) : wizard_(wizard) {
  setTitle(tr("Review"));
  setSubTitle(tr("Check the plan and the configuration, then start. The YAML runs the same with `tandem train`."));
  summary_ = new QLabel;
  summary_->setWordWrap(true);
  summary_->setTextFormat(Qt::RichText);
  plan_ = new MemoryMapWidget;
  plan_note_ = new QLabel;
  plan_note_->setWordWrap(true);
  plan_note_->setStyleSheet(QStringLiteral("font-style: italic;"));
  warnings_ = new QLabel;
  warnings_->setWordWrap(true);
  warnings_->setTextFormat(Qt::RichText);
  yaml_ = new QPlainTextEdit;
  yaml_->setReadOnly(true);
  yaml_->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
  yaml_->setAccessibleName(tr("Training YAML"));
  problem_ = makeProblemLabel();
  auto* save = new QPushButton(tr("Sa&ve YAML…"));
  auto* copy = new QPushButton(tr("&Copy tandem train command"));
  copy->setToolTip(tr("Saves the YAML first if needed, then copies the command that runs it without the studio"));
  connect(save, &QPushButton::clicked, this, &ReviewPage::saveYaml);
  connect(copy, &QPushButton::clicked, this, &ReviewPage::copyCommand);

  auto* plan_box = new QGroupBox(tr("Memory plan"));
  auto* plan_layout = new QVBoxLayout(plan_box);
  plan_layout->addWidget(plan_);
  plan_layout->addWidget(plan_note_);
  plan_layout->addWidget(warnings_);
  plan_layout->addStretch(1);
  auto* yaml_box = new QGroupBox(tr("Equivalent training YAML"));
  auto* yaml_layout = new QVBoxLayout(yaml_box);
  yaml_layout->addWidget(yaml_);
  auto* buttons = new QHBoxLayout;
  buttons->addWidget(save);
  buttons->addWidget(copy);
  buttons->addStretch(1);
  yaml_layout->addLayout(buttons);
  auto* split = new QSplitter(Qt::Horizontal);
  split->addWidget(plan_box);
  split->addWidget(yaml_box);
  split->setStretchFactor(0, 1);
  split->setStretchFactor(1, 1);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(summary_);
  layout->addWidget(problem_);
  layout->addWidget(split, 1);
}

QString ReviewPage::yamlText() const { return yaml_->toPlainText(); }
QString ReviewPage::warningsText() const { return warnings_->text(); }

void ReviewPage::initializePage() {
  const train::TrainConfig config = wizard_.config();
  const std::string yaml = train::toYaml(config);
  yaml_->setPlainText(QString::fromStdString(yaml));
  saved_path_.clear();
  ok_ = false;
  try {
    train::parseTrainConfig(yaml, "the wizard's config");  // the checks `tandem train` makes
    showProblem(problem_, {});
    ok_ = true;
  } catch (const Error& e) {
    showProblem(problem_, errorText(e));
  }
  QStringList datasets;
  for (const std::string& d : config.dataset) datasets << QString::fromStdString(d);
  summary_->setText(tr("<b>%1</b> with LoRA r=%2 on <b>%3</b> (template %4) → %5")
                        .arg(QString::fromStdString(config.model_name_or_path).toHtmlEscaped())
                        .arg(config.lora_rank)
                        .arg(datasets.join(QStringLiteral(", ")).toHtmlEscaped(),
                             QString::fromStdString(config.template_name).toHtmlEscaped(),
                             QString::fromStdString(config.output_dir.string()).toHtmlEscaped()));
  QStringList warnings;
  const MachineInfo& machine = wizard_.machine();
  if (machine.torch.gpus.empty() && config.device != "cpu") {
    warnings << tr("No GPU visible (%1): the whole model runs on the CPU.")
                    .arg(QString::fromStdString(machine.torch.gpu_status).toHtmlEscaped());
  }
  std::error_code ec;
  if (std::filesystem::exists(config.output_dir, ec) && !std::filesystem::is_empty(config.output_dir, ec)) {
    warnings << (config.overwrite_output_dir
                     ? tr("The output folder is not empty: overwrite is on, an earlier Tandem run there is cleared.")
                     : tr("The output folder is not empty: the same configuration resumes from its last checkpoint, "
                          "another one is refused."));
  }
  if (const auto& summary = wizard_.modelSummary()) {
    const std::vector<MemoryBar> bars = plannedWeightBars(machine, *summary, config);
    for (const MemoryBar& bar : bars) {
      if (bar.used() > bar.capacity_bytes) {
        warnings << tr("The weights alone need %1 on %2, which has %3.")
                        .arg(bytesText(bar.used()), bar.device, bytesText(bar.capacity_bytes));
      }
    }
    plan_->setBars(bars);
    plan_note_->setText(tr("Weights at the training precision, routed experts in RAM, the rest on the dense-part device; "
                           "'other' is what other programs use now. "
                           "LoRA, optimizer and activation memory come from the memory planner, which this build "
                           "does not have yet; the dashboard shows them live."));
  } else {
    plan_->setBars({});
    plan_note_->setText(tr("No plan: the model could not be inspected."));
  }
  warnings_->setText(warnings.isEmpty() ? tr("No warnings.")
                                        : QStringLiteral("<ul><li>%1</li></ul>").arg(warnings.join(QStringLiteral("</li><li>"))));
  emit completeChanged();
}

void ReviewPage::saveYaml() {
  const QString start = QDir(QString::fromStdString(wizard_.config().output_dir.string())).filePath(QStringLiteral("../train.yaml"));
  const QString path = QFileDialog::getSaveFileName(this, tr("Save training YAML"), QDir::cleanPath(start),
                                                    tr("YAML (*.yaml *.yml)"));
  if (path.isEmpty()) return;
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly) || file.write(yaml_->toPlainText().toUtf8()) < 0 || !file.commit()) {
    showProblem(problem_, tr("Could not write %1: %2").arg(path, file.errorString()));
    return;
  }
  saved_path_ = path;
}

void ReviewPage::copyCommand() {
  if (saved_path_.isEmpty()) saveYaml();  // the command needs a file to name
  if (saved_path_.isEmpty()) return;
  QApplication::clipboard()->setText(QStringLiteral("tandem train '%1'").arg(saved_path_));
}

}  // namespace tandem::ui
