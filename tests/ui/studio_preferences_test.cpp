// Preferences and everyday comforts of the studio on real runs of the demo model: settings persist
// in QSettings (a temporary folder) and take effect (the palette and the charts switch, the
// notification preference silences notices); recent models and datasets fill from started runs,
// cap at ten and are offered by the wizard; a new window's wizard holds the newest run's settings
// with a fresh output folder; selecting two recorded runs shows exactly the settings they were
// started with differently, next to both loss curves from the store; a completed and a failed run
// each raise one notice through an injected notifier; every menu action has a distinct shortcut,
// and Help > Keyboard shortcuts lists them all.

#include <QAction>
#include <QApplication>
#ifdef TANDEM_UI_WITH_DBUS
#include <QDBusConnection>
#include <QProcess>
#include <QStandardPaths>
#endif
#include <QCheckBox>
#include <QComboBox>
#include <QFile>
#include <QLineEdit>
#include <QMenu>
#include <QMenuBar>
#include <QSettings>
#include <QSignalSpy>
#include <QTableWidget>
#include <QTest>
#include <QToolButton>
#include <cstdlib>
#include <set>

#include "engine/store/run_store.h"
#include "tests/ui/ui_test_support.h"
#include "ui/last_run.h"
#include "ui/main_window.h"
#include "ui/memory_map.h"
#include "ui/metric_chart.h"
#include "ui/recent_items.h"
#include "ui/resources.h"
#include "ui/run_actions.h"
#include "ui/run_compare.h"
#include "ui/run_notifier.h"
#include "ui/runs_view.h"
#include "ui/settings_dialog.h"
#include "ui/shortcuts_dialog.h"
#include "ui/theme.h"
#include "ui/training_controller.h"
#include "ui/training_dashboard.h"

namespace tandem::ui {

namespace fs = std::filesystem;

namespace {

// What MainWindow would have put on the desktop.
class RecordingNotifier : public Notifier {
 public:
  explicit RecordingNotifier(std::vector<RunNotice>* notices) : notices_(notices) {}
  void notify(const RunNotice& notice) override { notices_->push_back(notice); }

 private:
  std::vector<RunNotice>* notices_;
};

#ifdef TANDEM_UI_WITH_DBUS
// A stand-in for the desktop's notification daemon: records each Notify call.
class FakeNotificationService : public QObject {
  Q_OBJECT
  Q_CLASSINFO("D-Bus Interface", "org.freedesktop.Notifications")

 public:
  struct Call {
    QString app, summary, body;
    QVariantMap hints;
  };
  std::vector<Call> calls;

 public slots:
  uint Notify(const QString& app_name, uint /*replaces_id*/, const QString& /*app_icon*/,
              const QString& summary, const QString& body, const QStringList& /*actions*/,
              const QVariantMap& hints, int /*expire_timeout*/) {
    calls.push_back({app_name, summary, body, hints});
    return static_cast<uint>(calls.size());
  }
};
#endif

QList<QAction*> menuActions(const QMenu& menu) {
  QList<QAction*> out;
  for (QAction* a : menu.actions()) {
    if (a->isSeparator()) continue;
    if (a->menu())
      out += menuActions(*a->menu());
    else
      out.append(a);
  }
  return out;
}

QList<QAction*> menuBarActions(const QMenuBar& bar) {
  QList<QAction*> out;
  for (QAction* top : bar.actions())
    if (top->menu()) out += menuActions(*top->menu());
  return out;
}

}  // namespace

class PreferencesTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void preferencesPersist();
  void paletteSwitches();
  void recentListsFillAndCap();
  void wizardPrefillsTheLastRun();
  void comparisonShowsTheDifferingKeys();
  void finishedRunsRaiseNotifications();
  void desktopNotifierCallsTheNotificationService();
  void everyActionHasAShortcut();

 private:
  // Runs `config` in the window and waits for its end.
  TrainFinish train(const train::TrainConfig& config);

  QTemporaryDir tmp_;
  StudioPaths paths_;
  QPalette platform_palette_;
  std::unique_ptr<MainWindow> window_;
  std::vector<RunNotice> notices_;
  int64_t run_a_ = 0, run_b_ = 0;
  fs::path out_b_;
};

TrainFinish PreferencesTest::train(const train::TrainConfig& config) {
  QSignalSpy finished(window_->trainingController(), &TrainingController::finished);
  window_->startTraining(config);
  if (!finished.wait(300000)) return {};
  return finished.front().front().value<TrainFinish>();
}

void PreferencesTest::initTestCase() {
  initStudioResources();
  QVERIFY(tmp_.isValid());
  // Settings go to a file in the temporary folder, never the user's.
  QSettings::setDefaultFormat(QSettings::IniFormat);
  QSettings::setPath(QSettings::IniFormat, QSettings::UserScope, tmp_.filePath("config"));
  QSettings::setPath(QSettings::NativeFormat, QSettings::UserScope, tmp_.filePath("config"));
  QCoreApplication::setOrganizationName(QStringLiteral("Tandem"));
  QCoreApplication::setApplicationName(QStringLiteral("Tandem Studio"));
  platform_palette_ = QApplication::palette();
  paths_ = test::demoPaths(tmp_);

  StudioSettings settings = StudioSettings::load();
  settings.run_store_path = tmp_.filePath("runs.db");
  settings.output_parent = tmp_.path();
  settings.save();
  window_ = std::make_unique<MainWindow>(StudioSettings::load(), paths_);
  window_->setNotifier(std::make_unique<RecordingNotifier>(&notices_));
  window_->show();

  // Two real runs that differ in the learning rate, the LoRA rank and (necessarily) the folder.
  const fs::path tmp = tmp_.path().toStdString();
  const TrainFinish a = train(
      test::demoConfig(paths_, tmp / "run-a",
                       {"max_steps=2", "logging_steps=1", "learning_rate=1.0e-3", "lora_rank=4"}));
  QVERIFY2(a.end == TrainEnd::Completed, qPrintable(a.error));
  out_b_ = tmp / "run-b";
  const TrainFinish b = train(test::demoConfig(
      paths_, out_b_, {"max_steps=2", "logging_steps=1", "learning_rate=3.0e-3", "lora_rank=8"}));
  QVERIFY2(b.end == TrainEnd::Completed, qPrintable(b.error));
  run_a_ = a.run_id;
  run_b_ = b.run_id;
  QVERIFY(run_a_ > 0 && run_b_ > run_a_);
}

void PreferencesTest::preferencesPersist() {
  const StudioSettings before = StudioSettings::load();
  QCOMPARE(before.theme, ThemeChoice::System);  // the defaults
  QVERIFY(before.notify_run_end);
  QVERIFY(before.prefill_last_run);

  SettingsDialog dialog(before);
  auto* theme = dialog.findChild<QComboBox*>(QStringLiteral("theme"));
  auto* notify = dialog.findChild<QCheckBox*>(QStringLiteral("notify_run_end"));
  auto* prefill = dialog.findChild<QCheckBox*>(QStringLiteral("prefill_last_run"));
  QVERIFY(theme && notify && prefill);
  theme->setCurrentIndex(theme->findData(QStringLiteral("dark")));
  notify->setChecked(false);
  prefill->setChecked(false);
  dialog.settings().save();

  const QString file = QSettings().fileName();
  QVERIFY2(file.startsWith(tmp_.path()), qPrintable(file));
  QFile ini(file);
  QVERIFY(ini.open(QIODevice::ReadOnly));
  const QByteArray text = ini.readAll();
  QVERIFY2(text.contains("theme=dark"), text.constData());
  QVERIFY(text.contains("run_end=false"));

  const StudioSettings after = StudioSettings::load();
  QCOMPARE(after.theme, ThemeChoice::Dark);
  QVERIFY(!after.notify_run_end);
  QVERIFY(!after.prefill_last_run);
  QCOMPARE(after.run_store_path, before.run_store_path);  // the rest untouched
  before.save();
  QCOMPARE(StudioSettings::load().theme, ThemeChoice::System);
}

void PreferencesTest::paletteSwitches() {
  MetricChart* chart = window_->dashboard()->lossChart();
  StudioSettings s = window_->settings();
  s.theme = ThemeChoice::Dark;
  window_->applySettings(s);
  QVERIFY(isDark(QApplication::palette()));
  QApplication::processEvents();  // widgets get the new palette by a posted event
  QVERIFY(isDark(window_->palette()));
  QCOMPARE(QApplication::style()->name().toLower(), QStringLiteral("fusion"));
  QVERIFY2(chart->chart()->backgroundBrush().color().lightness() < 80,
           qPrintable(chart->chart()->backgroundBrush().color().name()));
  QCOMPARE(StudioSettings::load().theme, ThemeChoice::Dark);  // applying saves
  // The memory map's free slice and problem text follow the palette (free was white on dark).
  const auto readsOn = [](const QColor& ink, const QPalette& palette) {
    return std::abs(ink.lightness() - palette.color(QPalette::Window).lightness()) > 80;
  };
  QVERIFY(!readsOn(memorySliceColor(MemorySlice::Free, QApplication::palette()),
                   QApplication::palette()));
  QVERIFY(readsOn(problemColor(QApplication::palette()), QApplication::palette()));

  s.theme = ThemeChoice::Light;
  window_->applySettings(s);
  QVERIFY(!isDark(QApplication::palette()));
  QApplication::processEvents();
  QVERIFY(chart->chart()->backgroundBrush().color().lightness() > 200);
  QVERIFY(!readsOn(memorySliceColor(MemorySlice::Free, QApplication::palette()),
                   QApplication::palette()));
  QVERIFY(readsOn(problemColor(QApplication::palette()), QApplication::palette()));

  s.theme = ThemeChoice::System;
  window_->applySettings(s);
  QCOMPARE(QApplication::palette().color(QPalette::Window),
           platform_palette_.color(QPalette::Window));
  QCOMPARE(QApplication::palette().color(QPalette::WindowText),
           platform_palette_.color(QPalette::WindowText));
}

void PreferencesTest::recentListsFillAndCap() {
  // The two runs put their model and dataset first.
  const QString model = QString::fromStdString((paths_.demo_workdir / "model").string());
  QCOMPARE(recentModels(), QStringList{model});
  const QList<RecentDataset> datasets = recentDatasets();
  QCOMPARE(datasets.size(), 1);
  QCOMPARE(datasets.front().dir, QString::fromStdString((paths_.resources / "demo").string()));
  QCOMPARE(datasets.front().dataset, QStringLiteral("identity"));

  // The wizard's model page offers it, and choosing it fills the field.
  auto* button = window_->wizard()->findChild<QToolButton*>(QStringLiteral("recent_models"));
  QVERIFY(button && button->menu());
  emit button->menu()->aboutToShow();
  QCOMPARE(button->menu()->actions().size(), 1);
  auto* path = window_->wizard()->findChild<QLineEdit*>(QStringLiteral("model_name_or_path"));
  path->clear();
  button->menu()->actions().front()->trigger();
  QCOMPARE(path->text(), model);
  auto* data_button = window_->wizard()->findChild<QToolButton*>(QStringLiteral("recent_datasets"));
  QVERIFY(data_button && data_button->menu());
  emit data_button->menu()->aboutToShow();
  QCOMPARE(data_button->menu()->actions().size(), 1);
  auto* dir = window_->wizard()->findChild<QLineEdit*>(QStringLiteral("dataset_dir"));
  dir->clear();
  data_button->menu()->actions().front()->trigger();
  QCOMPARE(dir->text(), datasets.front().dir);

  // Fifteen models: the newest ten stay, newest first; a repeat moves up, never twice.
  for (int i = 0; i < 15; ++i) rememberModel(QStringLiteral("/models/m%1").arg(i));
  QStringList models = recentModels();
  QCOMPARE(models.size(), kRecentLimit);
  QCOMPARE(models.front(), QStringLiteral("/models/m14"));
  QCOMPARE(models.back(), QStringLiteral("/models/m5"));
  rememberModel(QStringLiteral("/models/m7"));
  models = recentModels();
  QCOMPARE(models.size(), kRecentLimit);
  QCOMPARE(models.front(), QStringLiteral("/models/m7"));
  QCOMPARE(models.count(QStringLiteral("/models/m7")), 1);
  for (int i = 0; i < 12; ++i)
    rememberDataset({QStringLiteral("/data"), QStringLiteral("d%1").arg(i)});
  QCOMPARE(recentDatasets().size(), kRecentLimit);
  QCOMPARE(recentDatasets().front().dataset, QStringLiteral("d11"));
  emit button->menu()->aboutToShow();
  QCOMPARE(button->menu()->actions().size(), kRecentLimit);
  clearRecent();
  QVERIFY(recentModels().isEmpty());
  QVERIFY(recentDatasets().isEmpty());
}

void PreferencesTest::wizardPrefillsTheLastRun() {
  // This window's wizard moved on to run b's settings when b started.
  const train::TrainConfig now = window_->wizard()->config();
  QCOMPARE(now.lora_rank, 8);
  QCOMPARE(now.learning_rate, 3.0e-3);
  QCOMPARE(now.output_dir, fs::path(out_b_.string() + "-2"));
  // The next start of the studio: its wizard holds run b's settings, as a new run.
  MainWindow next(StudioSettings::load(), paths_);
  const train::TrainConfig c = next.wizard()->config();
  const std::optional<store::RunRecord> b = window_->runStore()->findRun(run_b_);
  QVERIFY(b);
  const train::TrainConfig recorded = train::parseTrainConfig(b->config_yaml, "run b");
  QCOMPARE(c.lora_rank, 8);
  QCOMPARE(c.learning_rate, 3.0e-3);
  QCOMPARE(c.max_steps, int64_t{2});
  QCOMPARE(c.model_name_or_path, recorded.model_name_or_path);
  QCOMPARE(c.dataset, recorded.dataset);
  QCOMPARE(c.template_name, recorded.template_name);
  QCOMPARE(c.output_dir, fs::path(out_b_.string() + "-2"));  // run b's folder is taken
  QVERIFY(c.resume == train::ResumeFrom::None);
  QVERIFY(!c.overwrite_output_dir);
  QCOMPARE(train::configFingerprint(c), train::configFingerprint(recorded));

  StudioSettings off = StudioSettings::load();
  off.prefill_last_run = false;
  off.save();
  MainWindow fresh(StudioSettings::load(), paths_);
  QVERIFY(fresh.wizard()->config().model_name_or_path.empty());
  off.prefill_last_run = true;
  off.save();

  QCOMPARE(freshOutputDir(tmp_.filePath("nothing-here").toStdString()),
           fs::path(tmp_.filePath("nothing-here").toStdString()));
  fs::create_directories(out_b_.string() + "-2");
  QCOMPARE(freshOutputDir(out_b_), fs::path(out_b_.string() + "-3"));
  QCOMPARE(freshOutputDir(out_b_.string() + "-2"), fs::path(out_b_.string() + "-3"));
  // A run that has not made its folder yet still keeps it.
  const fs::path unmade = tmp_.filePath("not-made-yet").toStdString();
  QCOMPARE(freshOutputDir(unmade, unmade), fs::path(unmade.string() + "-2"));
}

void PreferencesTest::comparisonShowsTheDifferingKeys() {
  RunsView* runs = window_->runsView();
  runs->refresh();
  runs->selectRuns({run_a_, run_b_});
  RunCompare* compare = runs->runCompare();
  QCOMPARE(compare->differingKeys(), (QStringList{"learning_rate", "lora_rank", "output_dir"}));
  // The table's values are the recorded configs' (newest run first, as the list shows them).
  const QTableWidget* table = compare->differencesTable();
  QCOMPARE(table->columnCount(), 3);
  const train::TrainConfig a =
      train::parseTrainConfig(window_->runStore()->findRun(run_a_)->config_yaml, "run a");
  const train::TrainConfig b =
      train::parseTrainConfig(window_->runStore()->findRun(run_b_)->config_yaml, "run b");
  const bool b_first =
      table->horizontalHeaderItem(1)->text().startsWith(QStringLiteral("#%1 ").arg(run_b_));
  const train::TrainConfig& first = b_first ? b : a;
  const train::TrainConfig& second = b_first ? a : b;
  QCOMPARE(table->item(0, 1)->text().toDouble(), first.learning_rate);
  QCOMPARE(table->item(0, 2)->text().toDouble(), second.learning_rate);
  QCOMPARE(table->item(1, 1)->text().toInt(), first.lora_rank);
  QCOMPARE(table->item(1, 2)->text().toInt(), second.lora_rank);
  QCOMPARE(table->item(2, 1)->text().toStdString(), first.output_dir.string());
  // Both loss curves, with every step the store holds.
  QCOMPARE(runs->compareChart()->pointCount(0), 2);
  QCOMPARE(runs->compareChart()->pointCount(1), 2);

  runs->selectRuns({run_a_});
  QVERIFY(compare->differingKeys().isEmpty());
  runs->selectRuns({run_a_, run_a_});
  // A key only one config has counts as a difference; equal configs have none.
  const std::vector<ConfigDifference> d =
      configDifferences({"learning_rate: 1.0e-3\nfoo: 1\n", "learning_rate: 1.0e-3\n"});
  QCOMPARE(d.size(), size_t{1});
  QCOMPARE(d.front().key, QStringLiteral("foo"));
  QVERIFY(d.front().values[1].isEmpty());
}

void PreferencesTest::finishedRunsRaiseNotifications() {
  // The two completed runs each raised one notice.
  QCOMPARE(notices_.size(), size_t{2});
  for (const RunNotice& n : notices_) {
    QCOMPARE(n.title, QStringLiteral("Training completed"));
    QVERIFY2(n.body.contains(QStringLiteral("2 steps")), qPrintable(n.body));
    QVERIFY(!n.failed);
  }
  QVERIFY(notices_[1].body.startsWith(QStringLiteral("run-b:")));

  // A run that fails (no such model) with notifications off: nothing; on: one failure notice.
  const fs::path tmp = tmp_.path().toStdString();
  train::TrainConfig broken = test::demoConfig(paths_, tmp / "run-broken", {"max_steps=1"});
  broken.model_name_or_path = (tmp / "no-such-model").string();
  StudioSettings s = window_->settings();
  s.notify_run_end = false;
  window_->applySettings(s);
  QCOMPARE(train(broken).end, TrainEnd::Failed);
  QCOMPARE(notices_.size(), size_t{2});
  s.notify_run_end = true;
  window_->applySettings(s);
  const TrainFinish failed = train(broken);
  QCOMPARE(failed.end, TrainEnd::Failed);
  QCOMPARE(notices_.size(), size_t{3});
  QVERIFY(notices_.back().failed);
  QCOMPARE(notices_.back().title, QStringLiteral("Training failed"));
  QVERIFY2(notices_.back().body.contains(failed.error), qPrintable(notices_.back().body));

  // A cancelled run is the user's own doing: no notice.
  TrainFinish cancelled;
  cancelled.end = TrainEnd::Cancelled;
  QVERIFY(!runNotice(cancelled, QStringLiteral("x")));
}

// The real DesktopNotifier on a private session bus with a fake notification service: a failed
// run's notice arrives as org.freedesktop.Notifications.Notify with critical urgency.
void PreferencesTest::desktopNotifierCallsTheNotificationService() {
#ifndef TANDEM_UI_WITH_DBUS
  QSKIP("built without Qt6DBus: notices go to the tray or the window alert");
#else
  const QString daemon = QStandardPaths::findExecutable(QStringLiteral("dbus-daemon"));
  if (daemon.isEmpty()) QSKIP("no dbus-daemon to run a private session bus");
  QProcess bus;
  bus.start(daemon, {QStringLiteral("--session"), QStringLiteral("--nofork"),
                     QStringLiteral("--print-address")});
  QVERIFY(bus.waitForReadyRead(10000));
  const QByteArray address = bus.readLine().trimmed();
  QVERIFY(!address.isEmpty());
  // Before anything in this process opened the session bus: it reads the address once.
  qputenv("DBUS_SESSION_BUS_ADDRESS", address);
  FakeNotificationService service;
  {
    QDBusConnection host =
        QDBusConnection::connectToBus(QString::fromLatin1(address), QStringLiteral("fake"));
    QVERIFY(host.isConnected());
    QVERIFY(host.registerService(QStringLiteral("org.freedesktop.Notifications")));
    QVERIFY(host.registerObject(QStringLiteral("/org/freedesktop/Notifications"), &service,
                                QDBusConnection::ExportAllSlots));
  }
  QVERIFY2(QDBusConnection::sessionBus().isConnected(),
           "the session bus was opened before the test set its address");

  DesktopNotifier desktop(window_.get());
  QCOMPARE(desktop.channel(), DesktopNotifier::Channel::DBus);  // offscreen: no tray
  TrainFinish failed;
  failed.end = TrainEnd::Failed;
  failed.error = QStringLiteral("no config.json in /nowhere");
  desktop.notify(*runNotice(failed, QStringLiteral("run-x")));
  QTRY_COMPARE_WITH_TIMEOUT(service.calls.size(), size_t{1}, 10000);
  QCOMPARE(service.calls[0].summary, QStringLiteral("Training failed"));
  QVERIFY(service.calls[0].body.startsWith(QStringLiteral("run-x: no config.json")));
  QCOMPARE(service.calls[0].app, QCoreApplication::applicationName());
  QCOMPARE(service.calls[0].hints.value(QStringLiteral("urgency")).toInt(), 2);  // critical
  QDBusConnection::disconnectFromBus(QStringLiteral("fake"));
  bus.kill();
  bus.waitForFinished();
#endif
}

void PreferencesTest::everyActionHasAShortcut() {
  const QList<QAction*> actions = menuBarActions(*window_->menuBar());
  QVERIFY(actions.size() >= 15);
  std::set<QString> keys;
  for (QAction* a : actions) {
    QVERIFY2(!a->shortcut().isEmpty(), qPrintable(a->text() + " has no shortcut"));
    for (const QKeySequence& k : a->shortcuts()) {
      QVERIFY2(keys.insert(k.toString()).second,
               qPrintable(k.toString() + " is used twice (" + a->text() + ")"));
    }
  }
  ShortcutsDialog dialog(*window_->menuBar(), window_->tabs());
  const QList<ShortcutRow> rows = dialog.rows();
  int menu_rows = 0;
  bool lists_itself = false, lists_refresh = false;
  for (const ShortcutRow& r : rows) {
    if (r.where.endsWith(QStringLiteral(" menu")) || r.where.contains(QStringLiteral(" menu >"))) {
      ++menu_rows;
      QVERIFY2(!r.shortcut.isEmpty(), qPrintable(r.action));
    }
    lists_itself = lists_itself ||
                   (r.action == QStringLiteral("Keyboard shortcuts") &&
                    r.shortcut.contains(
                        QKeySequence(Qt::CTRL | Qt::Key_Slash).toString(QKeySequence::NativeText)));
    lists_refresh =
        lists_refresh ||
        (r.where == QStringLiteral("Runs page") && r.action == QStringLiteral("Refresh") &&
         r.shortcut == QKeySequence(QKeySequence::Refresh).toString(QKeySequence::NativeText));
  }
  QCOMPARE(menu_rows, static_cast<int>(actions.size()));
  QCOMPARE(dialog.rowCount(), static_cast<int>(rows.size()));
  QVERIFY(lists_itself);
  QVERIFY(lists_refresh);
  // The Training menu follows the run: nothing to pause or stop now.
  QVERIFY(!window_->runActions()->pauseAction()->isEnabled());
  QVERIFY(!window_->runActions()->stopAction()->isEnabled());
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::PreferencesTest)
#include "studio_preferences_test.moc"
