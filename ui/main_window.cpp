#include "ui/main_window.h"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QCloseEvent>
#include <QFileDialog>
#include <QMenuBar>
#include <QMessageBox>
#include <QPushButton>
#include <QStatusBar>
#include <QTabWidget>
#include <QVBoxLayout>

#include "engine/core/error.h"
#include "ui/chat_controller.h"
#include "ui/chat_panel.h"
#include "ui/error_text.h"
#include "ui/last_run.h"
#include "ui/machine_check_dialog.h"
#include "ui/recent_items.h"
#include "ui/run_actions.h"
#include "ui/run_notifier.h"
#include "ui/runs_view.h"
#include "ui/settings_dialog.h"
#include "ui/shortcuts_dialog.h"
#include "ui/theme.h"
#include "ui/training_controller.h"
#include "ui/training_dashboard.h"

namespace tandem::ui {

MainWindow::MainWindow(StudioSettings settings, StudioPaths paths, QWidget* parent)
    : QMainWindow(parent), settings_(std::move(settings)), paths_(std::move(paths)) {
  setWindowTitle(tr("Tandem Studio"));
  setWindowIcon(QIcon(QStringLiteral(":/icons/tandem.svg")));
  applyTheme(settings_.theme);
  QString store_problem;
  try {
    store_ = std::make_unique<store::RunStore>(
        store::RunStore::open(settings_.run_store_path.toStdString()));
  } catch (const Error& e) {
    store_problem = errorText(e);
  }
  training_ = std::make_unique<TrainingController>(store_.get());
  chat_ = std::make_unique<ChatController>();

  wizard_ = new FineTuneWizard(host_, paths_);
  wizard_->setWindowFlags(Qt::Widget);  // a page of the window, not a dialog
  if (settings_.prefill_last_run && store_) {
    try {
      if (auto last = lastRunConfig(*store_)) wizard_->loadConfig(*last);
    } catch (const Error& e) {
      store_problem = errorText(e);
    }
  }
  dashboard_ = new TrainingDashboard(*training_, host_.info());
  dashboard_->setLogScale(settings_.log_scale_loss);
  chat_panel_ = new ChatPanel(*chat_);
  chat_panel_->setMaxNewTokens(settings_.chat_max_new_tokens);
  runs_ = new RunsView(store_.get());

  tabs_ = new QTabWidget;
  tabs_->setDocumentMode(true);
  // The wizard hides itself when finished or cancelled and is shown again for the next run;
  // inside its own page it cannot show through the other tabs.
  auto* wizard_page = new QWidget;
  auto* wizard_layout = new QVBoxLayout(wizard_page);
  wizard_layout->setContentsMargins(0, 0, 0, 0);
  wizard_layout->addWidget(wizard_);
  tabs_->addTab(wizard_page, QIcon(QStringLiteral(":/icons/wizard.svg")), tr("&New fine-tune"));
  tabs_->addTab(dashboard_, QIcon(QStringLiteral(":/icons/dashboard.svg")), tr("&Training"));
  tabs_->addTab(chat_panel_, QIcon(QStringLiteral(":/icons/chat.svg")), tr("&Chat"));
  tabs_->addTab(runs_, QIcon(QStringLiteral(":/icons/runs.svg")), tr("&Runs"));
  tabs_->setIconSize(QSize(20, 20));
  setCentralWidget(tabs_);
  notifier_ = std::make_unique<DesktopNotifier>(this);
  buildMenus();

  connect(&host_, &HostMachine::probed, dashboard_, &TrainingDashboard::showMachine);
  connect(wizard_, &FineTuneWizard::startRequested, this, &MainWindow::startTraining);
  connect(wizard_, &QWizard::rejected, this, &MainWindow::resetWizard);
  connect(runs_, &RunsView::resumeRequested, this, &MainWindow::startTraining);
  connect(runs_, &RunsView::chatRequested, this,
          [this](const QString& base, const QString& adapter, const QString& tmpl) {
            chat_panel_->setModels(base, adapter, tmpl);
            showTab(ChatTab);
          });
  connect(dashboard_, &TrainingDashboard::resumeRequested, this, [this] {
    train::TrainConfig config = training_->config();
    config.overwrite_output_dir = false;
    config.resume = train::ResumeFrom::Latest;
    startTraining(config);
  });
  connect(training_.get(), &TrainingController::stepped, this, [this](const StepEvent& p) {
    statusBar()->showMessage(tr("training: step %1 / %2, loss %3")
                                 .arg(p.step)
                                 .arg(p.total_steps)
                                 .arg(p.loss, 0, 'f', 4));
  });
  connect(training_.get(), &TrainingController::finished, this, [this](const TrainFinish& f) {
    statusBar()->showMessage(f.end == TrainEnd::Failed
                                 ? tr("training failed: %1").arg(f.error)
                                 : tr("training %1").arg(trainEndName(f.end)));
    runs_->refresh();
    if (settings_.notify_run_end && !close_when_stopped_ && notifier_) {
      const QString name =
          QString::fromStdString(training_->config().output_dir.filename().string());
      if (const auto notice = runNotice(f, name)) notifier_->notify(*notice);
    }
    if (f.end == TrainEnd::Completed) {
      chat_panel_->setModels(QString::fromStdString(training_->config().model_name_or_path),
                             f.output_dir,
                             QString::fromStdString(training_->config().template_name));
    }
    if (close_when_stopped_) close();
  });
  runs_->refresh();
  statusBar()->showMessage(store_problem.isEmpty()
                               ? tr("run history: %1").arg(settings_.run_store_path)
                               : tr("run history unavailable: %1").arg(store_problem));
  resize(1200, 820);
}

MainWindow::~MainWindow() = default;

void MainWindow::setNotifier(std::unique_ptr<Notifier> notifier) {
  notifier_ = std::move(notifier);
}

void MainWindow::buildMenus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QAction* fresh =
      file->addAction(QIcon(QStringLiteral(":/icons/wizard.svg")), tr("&New fine-tune"));
  fresh->setShortcut(QKeySequence::New);
  connect(fresh, &QAction::triggered, this, [this] {
    resetWizard();
    showTab(WizardTab);
  });
  QAction* open = file->addAction(tr("&Open training YAML…"));
  open->setShortcut(QKeySequence::Open);
  connect(open, &QAction::triggered, this, &MainWindow::openYaml);
  QAction* demo = file->addAction(tr("Start from the &demo preset"));
  demo->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_N));
  connect(demo, &QAction::triggered, this, &MainWindow::startFromDemo);
  QAction* prefs = file->addAction(QIcon(QStringLiteral(":/icons/settings.svg")), tr("&Settings…"));
  prefs->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Comma));
  connect(prefs, &QAction::triggered, this, &MainWindow::editSettings);
  file->addSeparator();
  QAction* quit = file->addAction(tr("&Quit"));
  // QKeySequence::Quit is empty on Windows and without a desktop's key theme.
  quit->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Q));
  connect(quit, &QAction::triggered, this, &QWidget::close);

  QMenu* view = menuBar()->addMenu(tr("&View"));
  const QString names[] = {tr("New fine-tune"), tr("Training"), tr("Chat"), tr("Runs")};
  for (int tab = 0; tab < 4; ++tab) {
    QAction* action = view->addAction(names[tab]);
    action->setShortcut(QKeySequence(Qt::CTRL | static_cast<Qt::Key>(Qt::Key_1 + tab)));
    connect(action, &QAction::triggered, this, [this, tab] { showTab(tab); });
  }
  run_actions_ = new RunActions(*training_, menuBar()->addMenu(tr("Tra&ining")));
  connect(run_actions_, &RunActions::resumeRequested, dashboard_,
          &TrainingDashboard::resumeRequested);
  QMenu* help = menuBar()->addMenu(tr("&Help"));
  QAction* shortcuts = help->addAction(tr("&Keyboard shortcuts"));
  shortcuts->setShortcuts({QKeySequence(Qt::CTRL | Qt::Key_Slash), QKeySequence(Qt::Key_F1)});
  connect(shortcuts, &QAction::triggered, this, &MainWindow::showShortcuts);
  QAction* check = help->addAction(tr("&Machine check…"));
  check->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_M));
  connect(check, &QAction::triggered, this, &MainWindow::showMachineCheck);
  QAction* diagnostics = help->addAction(tr("&Copy diagnostics"));
  diagnostics->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_C));
  connect(diagnostics, &QAction::triggered, this, &MainWindow::copyDiagnostics);
  help->addSeparator();
  QAction* about = help->addAction(tr("&About Tandem Studio"));
  about->setShortcut(QKeySequence(Qt::SHIFT | Qt::Key_F1));
  connect(about, &QAction::triggered, this, [this] {
    QMessageBox::about(
        this, tr("Tandem Studio"),
        tr("LoRA fine-tuning of MoE language models on one machine: routed experts on the CPU, "
           "the rest on the GPU.\nThe same engine as the `tandem` command."));
  });
}

void MainWindow::showMachineCheck() {
  if (!machine_check_) {
    machine_check_ = new MachineCheckDialog(settings_.output_parent, this);
  } else {
    machine_check_->runChecks();
  }
  machine_check_->show();
  machine_check_->raise();
}

void MainWindow::copyDiagnostics() {
  statusBar()->showMessage(tr("checking this machine for the diagnostics…"));
  diagnostics_.request(
      [dir = settings_.output_parent] { return checkMachineFor(dir); },
      [this](EngineResult<MachineReport> report) {
        if (!report.ok()) {
          statusBar()->showMessage(tr("machine check failed: %1").arg(report.error));
          return;
        }
        QApplication::clipboard()->setText(diagnosticsText(*report.value));
        statusBar()->showMessage(tr("diagnostics copied to the clipboard"), 5000);
      });
}

void MainWindow::startFromDemo() {
  statusBar()->showMessage(tr("making the demo model…"));
  demo_maker_.request(
      [paths = paths_, output_parent = settings_.output_parent.toStdString()] {
        return demoConfig(paths, output_parent);
      },
      [this](EngineResult<train::TrainConfig> config) {
        statusBar()->clearMessage();
        if (!config.ok()) {
          QMessageBox::warning(this, tr("Demo"), config.error);
          return;
        }
        wizard_->loadConfig(*config.value);
        wizard_->restart();
        showTab(WizardTab);
      });
}

void MainWindow::showTab(int tab) { tabs_->setCurrentIndex(tab); }

void MainWindow::resetWizard() {
  wizard_->restart();
  wizard_->show();  // QWizard hides itself when it is finished or cancelled
}

void MainWindow::startTraining(const train::TrainConfig& config) {
  if (training_->isRunning()) {
    QMessageBox::information(this, tr("Training"),
                             tr("A run is going; stop it before starting another."));
    resetWizard();
    return;
  }
  rememberTrainConfig(config);
  training_->start(config);
  showTab(TrainingTab);
  // The next fine-tune starts from this one, in a folder of its own.
  if (settings_.prefill_last_run) wizard_->loadConfig(nextRunConfig(config));
  resetWizard();
}

void MainWindow::openYaml() {
  const QString path = QFileDialog::getOpenFileName(this, tr("Training YAML"),
                                                    QString::fromStdString(paths_.presets.string()),
                                                    tr("YAML (*.yaml *.yml)"));
  if (path.isEmpty()) return;
  try {
    wizard_->loadConfig(train::loadTrainConfig(path.toStdString()));
    wizard_->restart();
    showTab(WizardTab);
  } catch (const Error& e) {
    QMessageBox::warning(this, tr("Training YAML"), errorText(e));
  }
}

void MainWindow::editSettings() {
  SettingsDialog dialog(settings_, this);
  if (dialog.exec() != QDialog::Accepted) return;
  if (dialog.forgetRecent()) clearRecent();
  applySettings(dialog.settings());
}

void MainWindow::applySettings(const StudioSettings& settings) {
  settings_ = settings;
  settings_.save();
  applyTheme(settings_.theme);
  dashboard_->setLogScale(settings_.log_scale_loss);
  chat_panel_->setMaxNewTokens(settings_.chat_max_new_tokens);
}

void MainWindow::showShortcuts() {
  ShortcutsDialog dialog(*menuBar(), tabs_, this);
  dialog.exec();
}

void MainWindow::closeEvent(QCloseEvent* event) {
  if (!training_->isRunning()) {
    event->accept();
    return;
  }
  if (close_when_stopped_) {  // already stopping; closes once the checkpoint is written
    event->ignore();
    return;
  }
  QMessageBox box(
      QMessageBox::Question, tr("A training run is going"),
      tr("Stop it with a checkpoint before closing? It can be resumed from the Runs page."),
      QMessageBox::NoButton, this);
  QPushButton* stop = box.addButton(tr("&Stop with checkpoint and quit"), QMessageBox::AcceptRole);
  QPushButton* discard =
      box.addButton(tr("Quit &without checkpoint"), QMessageBox::DestructiveRole);
  box.addButton(QMessageBox::Cancel);
  box.setDefaultButton(stop);
  box.exec();
  if (box.clickedButton() == stop) {
    close_when_stopped_ = true;
    training_->stop();
    statusBar()->showMessage(
        tr("stopping at the end of this step; the window closes after the checkpoint"));
  } else if (box.clickedButton() == discard) {
    close_when_stopped_ = true;
    training_->cancel();
  }
  event->ignore();
}

}  // namespace tandem::ui
