#pragma once
// The studio's main window: it assembles the pages (New fine-tune, Training, Chat, Runs), the
// menus and shortcuts, and owns the engine adapters (training and chat controllers) and the run
// store. Closing it during a run asks whether to stop with a checkpoint first.

#include <QMainWindow>
#include <memory>

#include "engine/store/run_store.h"
#include "ui/engine_worker.h"
#include "ui/fine_tune_wizard.h"
#include "ui/host_machine.h"
#include "ui/studio_settings.h"

class QTabWidget;

namespace tandem::ui {

class ChatController;
class ChatPanel;
class MachineCheckDialog;
class Notifier;
class RunActions;
class RunsView;
class TrainingController;
class TrainingDashboard;

class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  enum Tab { WizardTab, TrainingTab, ChatTab, RunsTab };

  MainWindow(StudioSettings settings, StudioPaths paths, QWidget* parent = nullptr);
  ~MainWindow() override;

  FineTuneWizard* wizard() const { return wizard_; }
  TrainingDashboard* dashboard() const { return dashboard_; }
  TrainingController* trainingController() const { return training_.get(); }
  ChatPanel* chatPanel() const { return chat_panel_; }
  ChatController* chatController() const { return chat_.get(); }
  RunsView* runsView() const { return runs_; }
  MachineCheckDialog* machineCheckDialog() const { return machine_check_; }  // null until shown
  QTabWidget* tabs() const { return tabs_; }
  store::RunStore* runStore() const { return store_.get(); }
  const StudioSettings& settings() const { return settings_; }
  // Where run-end notices go (a DesktopNotifier unless replaced; tests pass their own).
  void setNotifier(std::unique_ptr<Notifier> notifier);
  Notifier* notifier() const { return notifier_.get(); }
  RunActions* runActions() const { return run_actions_; }

 public slots:
  void showTab(int tab);
  void startTraining(const tandem::train::TrainConfig& config);
  void openYaml();
  void editSettings();
  void showMachineCheck();  // Help > Machine check…
  void copyDiagnostics();   // Help > Copy diagnostics: checks the machine, then copies
  void showShortcuts();     // Help > Keyboard shortcuts
  // Saves `settings` and applies what can change while running (palette, charts, chat length).
  void applySettings(const StudioSettings& settings);

 protected:
  void closeEvent(QCloseEvent* event) override;

 private:
  void buildMenus();
  void resetWizard();
  void startFromDemo();

  StudioSettings settings_;
  StudioPaths paths_;
  HostMachine host_;
  std::unique_ptr<store::RunStore> store_;
  std::unique_ptr<TrainingController> training_;
  std::unique_ptr<ChatController> chat_;
  QTabWidget* tabs_;
  FineTuneWizard* wizard_;
  TrainingDashboard* dashboard_;
  ChatPanel* chat_panel_;
  RunsView* runs_;
  MachineCheckDialog* machine_check_ = nullptr;
  std::unique_ptr<Notifier> notifier_;
  RunActions* run_actions_ = nullptr;
  bool close_when_stopped_ = false;
  EngineWorker demo_maker_{this};
  EngineWorker diagnostics_{this};
};

}  // namespace tandem::ui
