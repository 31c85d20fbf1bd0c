#include "ui/fine_tune_wizard.h"

#include <mutex>

#include "engine/model/demo_model.h"
#include "engine/train/training_plan.h"
#include "ui/host_machine.h"
#include "ui/wizard_pages.h"

namespace tandem::ui {

FineTuneWizard::FineTuneWizard(HostMachine& host, StudioPaths paths, QWidget* parent)
    : QWizard(parent), host_(host), paths_(std::move(paths)) {
  setWindowTitle(tr("New fine-tune"));
  setWizardStyle(QWizard::ModernStyle);
  setOption(QWizard::NoBackButtonOnStartPage);
  setOption(QWizard::HaveHelpButton, false);
  setButtonText(QWizard::FinishButton, tr("&Start training"));
  setPage(ModelPageId, new ModelPage(*this));
  setPage(HardwarePageId, new HardwarePage(*this));
  setPage(DatasetPageId, new DatasetPage(*this));
  setPage(TrainingPageId, new TrainingPage(*this));
  setPage(ReviewPageId, new ReviewPage(*this));
  setMinimumSize(860, 640);
  loadConfig(train::TrainConfig{});
  connect(this, &QWizard::accepted, this, [this] { emit startRequested(config()); });
}

void FineTuneWizard::loadConfig(const train::TrainConfig& config) {
  base_ = config;
  for (int id : pageIds()) static_cast<ConfigPage*>(page(id))->load(config);
}

train::TrainConfig FineTuneWizard::config() const {
  train::TrainConfig c = base_;
  for (int id : pageIds()) static_cast<const ConfigPage*>(page(id))->store(c);
  return c;
}

const MachineInfo& FineTuneWizard::machine() const { return host_.info(); }

void FineTuneWizard::setModelSummary(std::optional<io::ModelSummary> summary) {
  summary_ = std::move(summary);
  emit modelSummaryChanged();
}

void FineTuneWizard::setHardware(placement::Hardware hardware) {
  hardware_ = std::move(hardware);
  emit hardwareChanged();
}

bool FineTuneWizard::isBusy() const {
  if (host_.isBusy()) return true;
  for (int id : pageIds()) {
    if (static_cast<const ConfigPage*>(page(id))->isBusy()) return true;
  }
  return false;
}

std::optional<placement::MemoryPlan> FineTuneWizard::plan() const {
  if (!summary_ || !hasHardware()) return std::nullopt;
  return train::planTraining(config(), summary_->config, hardware_);
}

QString FineTuneWizard::yaml() const { return QString::fromStdString(train::toYaml(config())); }

std::filesystem::path demoModel(const StudioPaths& paths) {
  static std::mutex making;
  const std::lock_guard lock(making);
  return model::ensureDemoModel(paths.demo_workdir, paths.resources).dir;
}

train::TrainConfig demoConfig(const StudioPaths& paths,
                              const std::filesystem::path& output_parent) {
  return train::loadTrainConfig(paths.presets / "training" / "demo_lora_sft.yaml",
                                {"model_name_or_path=" + demoModel(paths).string(),
                                 "dataset_dir=" + (paths.resources / "demo").string(),
                                 "output_dir=" + (output_parent / "demo-lora").string()});
}

}  // namespace tandem::ui
