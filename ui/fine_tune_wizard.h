#pragma once
// The guided fine-tune wizard: model → hardware → dataset → LoRA and training → review. Each page
// edits part of one TrainConfig (the LLaMA-Factory training YAML in memory) and validates its
// input in place; the review page shows the YAML that `tandem train` would read. Settings the
// pages do not show keep the values of the config the wizard was loaded with (defaults, a preset,
// or a run being repeated). Engine calls (inspecting the model, reading the data, probing the
// machine) run on workers: a page shows "…" until their results arrive (isBusy()).

#include <QWizard>
#include <QWizardPage>
#include <filesystem>
#include <optional>

#include "engine/io/model_summary.h"
#include "engine/placement/hardware.h"
#include "engine/placement/memory_planner.h"
#include "engine/train/train_config.h"

namespace tandem::ui {

class HostMachine;
struct MachineInfo;

// Where the studio finds its bundled files (resources/, presets/).
struct StudioPaths {
  std::filesystem::path resources;  // holds demo/
  std::filesystem::path presets;    // holds training/, hardware/, placement/
  std::filesystem::path demo_workdir;
};

// The demo model's folder (`tandem demo`'s random Qwen3-MoE), made under paths.demo_workdir when
// it is not there yet (seconds: run it on a worker). One at a time: the model page and File >
// Start from the demo preset may ask at once, and both would write the same folder. Throws
// tandem::Error.
std::filesystem::path demoModel(const StudioPaths& paths);

// The demo preset (presets/training/demo_lora_sft.yaml) on the demo model and data, with
// output_dir under `output_parent`. Makes the demo model if needed (demoModel). Throws
// tandem::Error.
train::TrainConfig demoConfig(const StudioPaths& paths, const std::filesystem::path& output_parent);

// A wizard page that owns some TrainConfig fields.
class ConfigPage : public QWizardPage {
  Q_OBJECT

 public:
  using QWizardPage::QWizardPage;
  virtual void load(const train::TrainConfig& config) = 0;
  virtual void store(train::TrainConfig& config) const = 0;
  // What the page shows is not yet what its inputs say: an engine call (or the pause after a
  // keystroke before one) is out.
  virtual bool isBusy() const { return false; }
};

class FineTuneWizard : public QWizard {
  Q_OBJECT

 public:
  enum PageId { ModelPageId, HardwarePageId, DatasetPageId, TrainingPageId, ReviewPageId };

  // `host` must outlive the wizard.
  FineTuneWizard(HostMachine& host, StudioPaths paths, QWidget* parent = nullptr);

  // Fills every page from `config` (fields no page shows are kept as they are).
  void loadConfig(const train::TrainConfig& config);
  // The config as the pages say now.
  train::TrainConfig config() const;
  // toYaml(config()).
  QString yaml() const;

  HostMachine& host() const { return host_; }
  const MachineInfo& machine() const;
  const StudioPaths& paths() const { return paths_; }
  // Set by the model page when the chosen folder could be inspected.
  const std::optional<io::ModelSummary>& modelSummary() const { return summary_; }
  void setModelSummary(std::optional<io::ModelSummary> summary);

  // The machine plans are made for: this one (probed) or a presets/hardware/ preset. Empty
  // (hasHardware() false) until this machine's probe arrives.
  const placement::Hardware& hardware() const { return hardware_; }
  bool hasHardware() const { return !hardware_.numa_nodes.empty(); }  // a machine has one at least
  void setHardware(placement::Hardware hardware);
  // The memory planner's verdict on config() for hardware(); nullopt without an inspected model
  // or before the machine is known.
  // Throws tandem::Error when the planner cannot plan (e.g. an unknown kt_optimize_rule file).
  std::optional<placement::MemoryPlan> plan() const;
  // kt_optimize_rule of the config (set by the placement editor).
  void setPlacementRule(const std::filesystem::path& rule_file) {
    base_.placement_rule = rule_file;
  }

  // The machine is being probed or a page waits for an engine call (ConfigPage::isBusy).
  bool isBusy() const;

 signals:
  void startRequested(const tandem::train::TrainConfig& config);
  void modelSummaryChanged();
  void hardwareChanged();

 private:
  HostMachine& host_;
  StudioPaths paths_;
  train::TrainConfig base_;
  std::optional<io::ModelSummary> summary_;
  placement::Hardware hardware_;
};

}  // namespace tandem::ui
