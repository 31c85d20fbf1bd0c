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
#include "engine/placement/kt_rules.h"
#include "engine/train/training_plan.h"
#include "ui/error_text.h"
#include "ui/host_machine.h"
#include "ui/machine_info.h"
#include "ui/memory_map.h"
#include "ui/placement_board.h"
#include "ui/wizard_pages.h"

namespace tandem::ui {

ReviewPage::ReviewPage(FineTuneWizard& wizard) : wizard_(wizard) {
  setTitle(tr("Review"));
  setSubTitle(
      tr("Check the plan and the configuration, then start. The YAML runs the same with `tandem "
         "train`."));
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
  copy->setToolTip(tr(
      "Saves the YAML first if needed, then copies the command that runs it without the studio"));
  connect(save, &QPushButton::clicked, this, &ReviewPage::saveYaml);
  connect(copy, &QPushButton::clicked, this, &ReviewPage::copyCommand);
  auto* place = new QPushButton(tr("Edit &placement…"));
  place->setToolTip(
      tr("The placement board: layers on devices, experts on GPU per layer, fit and tokens/s as "
         "you drag; writes a KTransformers rule file that the config names as kt_optimize_rule"));
  connect(place, &QPushButton::clicked, this, &ReviewPage::editPlacement);

  auto* plan_box = new QGroupBox(tr("Memory plan"));
  auto* plan_layout = new QVBoxLayout(plan_box);
  plan_layout->addWidget(plan_);
  plan_layout->addWidget(plan_note_);
  plan_layout->addWidget(warnings_);
  plan_layout->addWidget(place, 0, Qt::AlignLeft);
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
  // The machine's probe may arrive after the page is shown.
  auto again = [this] {
    if (wizard_.currentPage() == this) initializePage();
  };
  connect(&wizard_, &FineTuneWizard::hardwareChanged, this, again);
  connect(&wizard_.host(), &HostMachine::probed, this, again);
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
  if (wizard_.host().isProbed() && machine.torch.gpus.empty() && config.device != "cpu") {
    warnings << tr("No GPU visible (%1): the whole model runs on the CPU.")
                    .arg(QString::fromStdString(machine.torch.gpu_status).toHtmlEscaped());
  }
  std::error_code ec;
  if (std::filesystem::exists(config.output_dir, ec) &&
      !std::filesystem::is_empty(config.output_dir, ec)) {
    warnings << (config.overwrite_output_dir ? tr("The output folder is not empty: overwrite is "
                                                  "on, an earlier Tandem run there is cleared.")
                                             : tr("The output folder is not empty: the same "
                                                  "configuration resumes from its last checkpoint, "
                                                  "another one is refused."));
  }
  try {
    if (const std::optional<placement::MemoryPlan> plan = wizard_.plan()) {
      plan_->setBars(plannedMemoryBars(*plan));
      for (const std::string& p : plan->problems)
        warnings << QString::fromStdString(p).toHtmlEscaped();
      for (const std::string& a : plan->advice)
        warnings << tr("Advice: %1").arg(QString::fromStdString(a).toHtmlEscaped());
      QStringList notes;
      for (const std::string& n : plan->notes) notes << QString::fromStdString(n);
      plan_note_->setText(
          tr("The memory planner's prediction for %1%2. Hover a bar for its items.%3")
              .arg(QString::fromStdString(wizard_.hardware().name),
                   config.placement_rule.empty()
                       ? tr(" with its own placement")
                       : tr(" with the placement in %1")
                             .arg(QString::fromStdString(config.placement_rule.string())),
                   notes.isEmpty() ? QString()
                                   : QStringLiteral("\n") + notes.join(QStringLiteral("\n"))));
      if (!plan->fits) {
        ok_ = false;
        showProblem(
            problem_,
            tr("The run does not fit %1: %2")
                .arg(QString::fromStdString(wizard_.hardware().name),
                     QString::fromStdString(plan->problems.empty() ? "" : plan->problems.front())));
      }
    } else {
      plan_->setBars({});
      plan_note_->setText(wizard_.modelSummary()
                              ? tr("No plan yet: this machine is being probed.")
                              : tr("No plan: the model could not be inspected."));
    }
  } catch (const Error& e) {
    plan_->setBars({});
    plan_note_->setText(tr("No plan: %1").arg(errorText(e)));
  }
  warnings_->setText(
      warnings.isEmpty()
          ? tr("No warnings.")
          : QStringLiteral("<ul><li>%1</li></ul>").arg(warnings.join(QStringLiteral("</li><li>"))));
  emit completeChanged();
}

void ReviewPage::editPlacement() {
  const auto& summary = wizard_.modelSummary();
  if (!summary) return;
  const train::TrainConfig config = wizard_.config();
  try {
    placement::Placement initial;
    if (!config.placement_rule.empty())
      initial = placement::loadPlacementFile(config.placement_rule, summary->config);
    PlacementBoard board(train::planRequestFor(config, summary->config), wizard_.hardware(),
                         initial, this);
    if (board.exec() != QDialog::Accepted) return;
    // The rule file sits beside the output folder, named after it, so the YAML can point at it.
    const std::filesystem::path rule =
        config.output_dir.parent_path() / (config.output_dir.filename().string() + "_kt_rule.yaml");
    std::filesystem::create_directories(rule.parent_path());
    if (!board.exportRules(rule)) {
      showProblem(problem_, board.problem());
      return;
    }
    wizard_.setPlacementRule(rule);
    initializePage();
  } catch (const Error& e) {
    showProblem(problem_, errorText(e));
  }
}

void ReviewPage::saveYaml() {
  const QString start = QDir(QString::fromStdString(wizard_.config().output_dir.string()))
                            .filePath(QStringLiteral("../train.yaml"));
  const QString path = QFileDialog::getSaveFileName(
      this, tr("Save training YAML"), QDir::cleanPath(start), tr("YAML (*.yaml *.yml)"));
  if (path.isEmpty()) return;
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly) || file.write(yaml_->toPlainText().toUtf8()) < 0 ||
      !file.commit()) {
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
