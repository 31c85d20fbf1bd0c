// The studio's training and chat adapters on real engine work: a short LoRA run of the demo model
// feeds the dashboard; the run store (written by the engine, not by the UI) must hold the very
// losses the dashboard drew, and the runs view must list the run; pause holds the trainer, stop
// writes a checkpoint, and the runs view's resume finishes the run; the chat tab streams answers
// that equal the engine's Generator called directly with the same settings and seed, and a second
// message continues each side's own conversation.

#include <QApplication>
#include <QMessageBox>
#include <QPushButton>
#include <QSignalSpy>
#include <QTest>
#include <QTimer>

#include "engine/infer/generator.h"
#include "engine/model/checkpoint_dir.h"
#include "engine/placement/sequence_fit.h"
#include "engine/store/run_store.h"
#include "engine/train/trainer.h"
#include "tests/ui/ui_test_support.h"
#include "ui/chat_controller.h"
#include "ui/chat_panel.h"
#include "ui/machine_info.h"
#include "ui/main_window.h"
#include "ui/memory_map.h"
#include "ui/metric_chart.h"
#include "ui/resources.h"
#include "ui/runs_view.h"
#include "ui/sequence_fit_label.h"
#include "ui/training_controller.h"
#include "ui/training_dashboard.h"

namespace tandem::ui {

namespace fs = std::filesystem;

class TrainingTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void dashboardReceivesRealSteps();
  void runsViewListsTheRun();
  void chatStreamsRealAnswers();
  void chatPanelKeepsTheConversation();
  void pauseStopAndResume();
  void closingDuringARunStopsWithACheckpoint();
  void sequenceFitLabelSaysTheLongest();

 private:
  QTemporaryDir tmp_;
  StudioPaths paths_;
  MachineInfo machine_;
  std::unique_ptr<store::RunStore> store_;
  train::TrainConfig config_;
  std::vector<double> dashboard_losses_;
};

void TrainingTest::initTestCase() {
  initStudioResources();
  QVERIFY(tmp_.isValid());
  paths_ = test::demoPaths(tmp_);
  machine_ = detectMachine();
  store_ = std::make_unique<store::RunStore>(
      store::RunStore::open(fs::path(tmp_.path().toStdString()) / "runs.db"));
  config_ = test::demoConfig(paths_, fs::path(tmp_.path().toStdString()) / "run1",
                             {"max_steps=4", "logging_steps=1", "save_steps=2"});
}

void TrainingTest::dashboardReceivesRealSteps() {
  TrainingController controller(store_.get());
  TrainingDashboard dashboard(controller, machine_);
  dashboard.show();
  QSignalSpy steps(&controller, &TrainingController::stepped);
  QSignalSpy checkpoints(&controller, &TrainingController::checkpointed);
  QSignalSpy finished(&controller, &TrainingController::finished);
  controller.start(config_);
  QVERIFY(controller.isRunning());
  QVERIFY(finished.wait(300000));
  const auto finish = finished.front().front().value<TrainFinish>();
  QVERIFY2(finish.end == TrainEnd::Completed, qPrintable(finish.error));
  QCOMPARE(finish.steps, int64_t{4});
  QVERIFY(!controller.isRunning());

  QCOMPARE(steps.size(), 4);
  for (int i = 0; i < steps.size(); ++i) {
    const auto p = steps[i].front().value<StepEvent>();
    QCOMPARE(p.step, int64_t{i + 1});
    QCOMPARE(p.total_steps, int64_t{4});
    QVERIFY(std::isfinite(p.loss) && p.loss > 0);
    QVERIFY(p.tokens_per_s > 0);
    dashboard_losses_.push_back(p.loss);
  }
  QCOMPARE(checkpoints.size(),
           1);  // save_steps 2 of 4: step 2 (the end writes the final adapter instead)
  QCOMPARE(dashboard.pointsReceived(), 4);
  QCOMPARE(dashboard.lossChart()->pointCount(0), 4);  // raw
  QCOMPARE(dashboard.lossChart()->pointCount(1), 4);  // smoothed
  QVERIFY(!dashboard.memoryMap()->bars().empty());
  // The planner's longest cutoff_len for the run, beside the memory map (issue 29).
  const QString fit_text = dashboard.sequenceFit()->text();
  QVERIFY2(fit_text.contains(QStringLiteral("Longest cutoff_len that fits: ")) &&
               fit_text.contains(QStringLiteral(" tokens (this run %1: ").arg(config_.cutoff_len)),
           qPrintable(fit_text));
  QVERIFY(dashboard.logText().contains(QStringLiteral("checkpoint at step 2")));
  QCOMPARE(finish.final_loss, dashboard_losses_.back());
  QCOMPARE(steps.back().front().value<StepEvent>().world_size, 1);
  QVERIFY(!dashboard.statusText().contains(QStringLiteral("ranks")));
  // Rank 0 of a data-parallel job reports its steps with the job's world size.
  StepEvent job_step = steps.back().front().value<StepEvent>();
  job_step.world_size = 2;
  emit controller.stepped(job_step);
  QVERIFY2(dashboard.statusText().contains(QStringLiteral("2 ranks (rank 0's view")),
           qPrintable(dashboard.statusText()));
}

void TrainingTest::runsViewListsTheRun() {
  RunsView view(store_.get());
  view.refresh();
  QCOMPARE(view.runCount(), 1);
  const store::RunRecord& run = view.runs().front();
  QCOMPARE(run.status, store::RunStatus::Completed);
  QCOMPARE(run.last_step.value_or(0), int64_t{4});
  QCOMPARE(fs::path(run.output_dir), config_.output_dir);
  view.selectRuns({run.id});
  QCOMPARE(view.compareChart()->pointCount(0), 4);
  const std::vector<store::StepMetrics> metrics = store_->metrics(run.id);
  QCOMPARE(metrics.size(), dashboard_losses_.size());
  for (size_t i = 0; i < metrics.size(); ++i) QCOMPARE(metrics[i].loss, dashboard_losses_[i]);
}

void TrainingTest::chatStreamsRealAnswers() {
  ChatController chat;
  QSignalSpy streamed(&chat, &ChatController::streamed);
  QSignalSpy answered(&chat, &ChatController::answered);
  QSignalSpy failed(&chat, &ChatController::failed);
  ChatQuestion question;
  question.base_model = QString::fromStdString(config_.model_name_or_path);
  question.adapter_dir = QString::fromStdString(config_.output_dir.string());
  question.template_name = QString::fromStdString(config_.template_name);
  question.question = QStringLiteral("Who are you?");
  question.settings.max_new_tokens = 12;
  question.settings.do_sample =
      true;  // sampled, with a seed: reproducible, and the same for both sides
  question.settings.seed = 7;

  // The reference: the engine's Generator called here directly, same options, settings and seed.
  auto reference = infer::Generator::load(
      config_.model_name_or_path, chatOptionsFor(question.base_model, question.template_name));
  reference->addAdapter("tuned", config_.output_dir);
  infer::ChatRequest request;
  request.messages = {{"user", "Who are you?"}};
  request.settings = question.settings;
  QString expected[2];
  for (int side = 0; side < 2; ++side) {
    request.adapter = side == 0 ? "base" : "tuned";
    expected[side] = QString::fromStdString(reference->chat(request).text);
  }
  QVERIFY(expected[0] != expected[1]);  // the adapter changes the answer

  chat.ask(question);
  QTRY_VERIFY_WITH_TIMEOUT(!chat.isBusy(), 300000);
  QVERIFY2(failed.isEmpty(), failed.isEmpty() ? "" : qPrintable(failed.front().front().toString()));
  QCOMPARE(answered.size(), 2);

  // Each side streamed piece by piece: every text extends the one before.
  QString last[2];
  int updates[2] = {0, 0};
  for (const QList<QVariant>& s : streamed) {
    const int side = s[0].toInt();
    const QString text = s[1].toString();
    QVERIFY(text.startsWith(last[side]));
    last[side] = text;
    ++updates[side];
  }
  QVERIFY(updates[0] > 1 && updates[1] > 1);
  QCOMPARE(last[0], expected[0]);
  QCOMPARE(last[1], expected[1]);
}

void TrainingTest::chatPanelKeepsTheConversation() {
  ChatController chat;
  ChatPanel panel(chat);
  const QString base = QString::fromStdString(config_.model_name_or_path);
  const QString adapter = QString::fromStdString(config_.output_dir.string());
  const QString template_name = QString::fromStdString(config_.template_name);
  panel.setModels(base, adapter, template_name);
  panel.setMaxNewTokens(8);
  panel.setSampling(false);
  auto reference =
      infer::Generator::load(config_.model_name_or_path, chatOptionsFor(base, template_name));
  reference->addAdapter("tuned", config_.output_dir);
  infer::ChatRequest request;
  request.settings.do_sample = false;
  request.settings.max_new_tokens = 8;
  auto answer = [&](int side, std::vector<infer::ChatMessage> messages) {
    request.adapter = side == 0 ? "base" : "tuned";
    request.messages = std::move(messages);
    return QString::fromStdString(reference->chat(request).text);
  };
  const std::string questions[2] = {"Who are you?", "Say that again."};
  std::vector<infer::ChatMessage> conversation[2];
  for (const std::string& question : questions) {
    panel.setQuestion(QString::fromStdString(question));
    panel.send();
    QTRY_VERIFY_WITH_TIMEOUT(!chat.isBusy(), 300000);
    for (int side = 0; side < 2; ++side) {
      conversation[side].push_back({"user", question});
      const QString expected = answer(side, conversation[side]);
      QCOMPARE(panel.answer(side), expected);
      conversation[side].push_back({"assistant", expected.toStdString()});
    }
  }
  QCOMPARE(panel.turns(), 2);
  // The earlier exchange changes a second answer: the check above can tell a panel that forgot it.
  const std::vector<infer::ChatMessage> alone = {{"user", questions[1]}};
  const QString alone_answers[2] = {answer(0, alone), answer(1, alone)};
  QVERIFY(alone_answers[0] != panel.answer(0) || alone_answers[1] != panel.answer(1));
  panel.newChat();
  QCOMPARE(panel.turns(), 0);
}

void TrainingTest::pauseStopAndResume() {
  const train::TrainConfig config =
      test::demoConfig(paths_, fs::path(tmp_.path().toStdString()) / "run2",
                       {"max_steps=6", "logging_steps=1", "save_steps=100"});
  TrainingController controller(store_.get());
  QSignalSpy steps(&controller, &TrainingController::stepped);
  QSignalSpy finished(&controller, &TrainingController::finished);
  controller.start(config);
  QVERIFY(steps.wait(300000));
  controller.pause();
  QVERIFY(controller.isPaused());
  // The trainer is held at a step boundary: the store says so, and no step arrives meanwhile.
  const auto run = [&] { return store_->findByOutputDir(config.output_dir); };
  QTRY_VERIFY_WITH_TIMEOUT(run() && run()->status == store::RunStatus::Paused, 60000);
  // The trainer posts a step's signal before it holds and records the pause: deliver it first, or
  // it lands in the wait below and looks like a step taken while paused.
  QCoreApplication::sendPostedEvents();
  const qsizetype held_at = steps.size();
  QTest::qWait(300);
  QCOMPARE(steps.size(), held_at);
  QVERIFY(held_at < 6);

  controller.stop();  // from the pause: ends with a checkpoint
  QVERIFY(finished.wait(300000));
  const auto stopped = finished.front().front().value<TrainFinish>();
  QVERIFY2(stopped.end == TrainEnd::Stopped, qPrintable(stopped.error));
  QCOMPARE(run()->status, store::RunStatus::Stopped);
  QVERIFY(!model::lastCheckpoint(config.output_dir).empty());

  // Resume as the runs view does: the recorded config, from the newest checkpoint.
  const train::TrainConfig again = RunsView::resumeConfig(*run());
  finished.clear();
  steps.clear();
  controller.start(again);
  QVERIFY(finished.wait(300000));
  const auto done = finished.front().front().value<TrainFinish>();
  QVERIFY2(done.end == TrainEnd::Completed, qPrintable(done.error));
  QCOMPARE(done.steps, int64_t{6});
  QCOMPARE(steps.front().front().value<StepEvent>().step, stopped.steps + 1);
  QCOMPARE(run()->status, store::RunStatus::Completed);
  QCOMPARE(run()->last_step.value_or(0), int64_t{6});
}

void TrainingTest::closingDuringARunStopsWithACheckpoint() {
  StudioSettings settings;
  settings.run_store_path =
      QString::fromStdString((fs::path(tmp_.path().toStdString()) / "window-runs.db").string());
  settings.output_parent = tmp_.path();
  settings.demo_workdir = QString::fromStdString(paths_.demo_workdir.string());
  MainWindow window(settings, paths_);
  window.show();
  QVERIFY(QTest::qWaitForWindowExposed(&window));
  const train::TrainConfig config =
      test::demoConfig(paths_, fs::path(tmp_.path().toStdString()) / "run3",
                       {"max_steps=50", "logging_steps=1", "save_steps=1000"});
  QSignalSpy steps(window.trainingController(), &TrainingController::stepped);
  window.startTraining(config);
  QVERIFY(steps.wait(300000));

  // The close asks; the user picks "stop with checkpoint" (the default button).
  QString asked;
  QTimer::singleShot(0, [&] {
    auto* box = qobject_cast<QMessageBox*>(QApplication::activeModalWidget());
    if (!box) return;
    asked = box->text();
    box->defaultButton()->click();
  });
  window.close();
  QVERIFY2(asked.contains(QStringLiteral("checkpoint")), qPrintable(asked));
  QVERIFY(window.isVisible());  // it waits for the checkpoint
  QTRY_VERIFY_WITH_TIMEOUT(!window.isVisible(), 300000);
  const auto run = window.runStore()->findByOutputDir(config.output_dir);
  QVERIFY(run.has_value());
  QCOMPARE(run->status, store::RunStatus::Stopped);
  QVERIFY(run->last_step.value_or(0) < 50);
  QVERIFY(!model::lastCheckpoint(config.output_dir).empty());
}

// The label says the planner's figures as they are, and the tooltip what lengthens the sequence.
void TrainingTest::sequenceFitLabelSaysTheLongest() {
  SequenceFitLabel label;
  QVERIFY(label.text().contains(QStringLiteral("not planned yet")));
  placement::SequenceFit fit;
  fit.cutoff_len = 2048;
  fit.gpu_peak_bytes = uint64_t{10} << 30;
  fit.gpu_peak_device = "cuda:0";
  fit.host_bytes = uint64_t{61} << 30;
  fit.longest_cutoff_len = 21760;
  fit.lengthen = {"offload_checkpoints: true (48640 tokens)"};
  label.setFit(std::make_shared<const placement::SequenceFit>(fit));
  QVERIFY2(label.text().contains(QStringLiteral("Longest cutoff_len that fits: 21760 tokens (this "
                                                "run 2048: GPU peak 10.0 GiB on cuda:0, host "
                                                "61.0 GiB, planned)")),
           qPrintable(label.text()));
  QVERIFY2(label.toolTip().contains(
               QStringLiteral("Longer with offload_checkpoints: true (48640 tokens)")),
           qPrintable(label.toolTip()));
  fit.longest_cutoff_len = 0;
  label.setFit(std::make_shared<const placement::SequenceFit>(fit));
  QVERIFY(label.text().contains(QStringLiteral("none (not even 256 tokens)")));
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::TrainingTest)
#include "studio_training_test.moc"
