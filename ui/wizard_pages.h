#pragma once
// The five pages of the FineTuneWizard. Each one edits its part of the TrainConfig, says what is
// wrong in place (a red line under its inputs) and keeps Next disabled until it is fixed.

#include <QString>
#include <functional>
#include <memory>
#include <optional>

#include "engine/io/model_summary.h"
#include "ui/dataset_preview.h"
#include "ui/engine_worker.h"
#include "ui/fine_tune_wizard.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QMenu;
class QPlainTextEdit;
class QSpinBox;
class QTableWidget;
class QTextBrowser;
class QTimer;
class QToolButton;

namespace tandem::ui {

class MemoryMapWidget;
class TokenizerCache;

// A label that shows a problem in red, or hides when there is none.
QLabel* makeProblemLabel();
// A form label whose mnemonic (&x) focuses `buddy` (QFormLayout only does that for widget rows).
QLabel* buddyLabel(const QString& text, QWidget* buddy);
void showProblem(QLabel* label, const QString& problem);
// A "Recent" button whose menu `fill` makes afresh each time it opens (ui/recent_items.h).
QToolButton* recentMenuButton(const QString& text, const QString& object_name,
                              const std::function<void(QMenu*)>& fill);

class ModelPage : public ConfigPage {
  Q_OBJECT

 public:
  explicit ModelPage(FineTuneWizard& wizard);
  void load(const train::TrainConfig& config) override;
  void store(train::TrainConfig& config) const override;
  bool isComplete() const override { return ok_; }
  bool isBusy() const override;

 private:
  void inspect();
  void showSummary(EngineResult<io::ModelSummary> summary);
  void showVerdict();  // the memory planner's, for the wizard's hardware
  void useDemoModel();

  FineTuneWizard& wizard_;
  QLineEdit* path_;
  QLabel* summary_;
  QLabel* badge_;
  QLabel* problem_;
  QTimer* debounce_;
  bool ok_ = false;
  EngineWorker inspector_{this};
  EngineWorker demo_maker_{this};
};

class HardwarePage : public ConfigPage {
  Q_OBJECT

 public:
  explicit HardwarePage(FineTuneWizard& wizard);
  void load(const train::TrainConfig& config) override;
  void store(train::TrainConfig& config) const override;
  bool isComplete() const override;
  void initializePage() override;

 private:
  void choosePreset();
  void showProbe();    // this machine's probe arrived
  void fillDevices();  // auto, CPU and this machine's GPUs; keeps the choice
  void selectDevice(const QString& device);
  void limitGpuExperts();

  FineTuneWizard& wizard_;
  QComboBox* target_;
  QLabel* machine_text_;
  QLabel* problem_;
  QComboBox* device_;
  QComboBox* backend_;
  QComboBox* format_;
  QComboBox* wt_policy_;
  QComboBox* experts_mode_;
  QSpinBox* gpu_experts_;  // -1: auto
  QSpinBox* threads_;
};

class DatasetPage : public ConfigPage {
  Q_OBJECT

 public:
  explicit DatasetPage(FineTuneWizard& wizard);
  void load(const train::TrainConfig& config) override;
  void store(train::TrainConfig& config) const override;
  bool isComplete() const override { return ok_; }
  void initializePage() override;
  bool isBusy() const override;

  int previewRows() const;
  QString renderedHtml() const;
  QString skippedText() const;

 private:
  void listDatasets();
  void refresh();
  void showPreview(EngineResult<DatasetPreview> preview);
  void renderRow(int row);

  FineTuneWizard& wizard_;
  QLineEdit* dir_;
  QComboBox* dataset_;
  QComboBox* template_;
  QSpinBox* cutoff_;
  QSpinBox* max_samples_;
  QDoubleSpinBox* val_size_;
  QCheckBox* train_on_prompt_;
  QCheckBox* mask_history_;
  QCheckBox* packing_;
  QCheckBox* neat_packing_;
  QTableWidget* table_;
  QTextBrowser* rendered_;
  QLabel* skipped_;
  QLabel* problem_;
  QTimer* debounce_;
  std::vector<chat::Conversation> rows_;  // the first kPreviewRows
  bool ok_ = false;
  // Shared with the render calls, which may outlive the page.
  std::shared_ptr<TokenizerCache> tokenizers_;
  EngineWorker data_worker_{this};
  EngineWorker render_worker_{this};
};

class TrainingPage : public ConfigPage {
  Q_OBJECT

 public:
  explicit TrainingPage(FineTuneWizard& wizard);
  void load(const train::TrainConfig& config) override;
  void store(train::TrainConfig& config) const override;
  bool isComplete() const override;

 private:
  void check();

  QSpinBox* rank_;
  QSpinBox* alpha_;
  QDoubleSpinBox* dropout_;
  QLineEdit* target_;
  QCheckBox* rslora_;
  QLineEdit* lr_;
  QDoubleSpinBox* epochs_;
  QSpinBox* max_steps_;
  QSpinBox* batch_;
  QSpinBox* accumulation_;
  QComboBox* scheduler_;
  QDoubleSpinBox* warmup_;
  QDoubleSpinBox* grad_clip_;
  QDoubleSpinBox* weight_decay_;
  QSpinBox* seed_;
  QCheckBox* bf16_;
  QCheckBox* checkpointing_;
  QSpinBox* logging_;
  QSpinBox* save_steps_;
  QSpinBox* save_limit_;
  QLineEdit* output_;
  QCheckBox* overwrite_;
  QCheckBox* plot_;
  QLabel* problem_;
};

class ReviewPage : public ConfigPage {
  Q_OBJECT

 public:
  explicit ReviewPage(FineTuneWizard& wizard);
  void load(const train::TrainConfig&) override {}
  void store(train::TrainConfig&) const override {}
  void initializePage() override;
  bool isComplete() const override { return ok_; }
  QString yamlText() const;
  QString warningsText() const;

 private:
  void saveYaml();
  void copyCommand();
  void editPlacement();

  FineTuneWizard& wizard_;
  QLabel* summary_;
  MemoryMapWidget* plan_;
  QLabel* plan_note_;
  QLabel* warnings_;
  QPlainTextEdit* yaml_;
  QLabel* problem_;
  QString saved_path_;
  bool ok_ = false;
};

}  // namespace tandem::ui
