// The placement editor on the demo model with the real planner: a KTransformers rule file
// exported by the editor reads back (in a second editor and through the engine's own reader) as
// the same placement, edits included; and an edit that cannot fit is refused with the reason,
// leaving the placement as it was. The machine is the probed host with a 24 GB card in place of
// its GPUs, so the tests see the same placements on CI and on a workstation with a GPU; the one
// that trains uses the host as it is, since the run happens here.

#include <QHeaderView>
#include <QTableWidget>
#include <QTest>

#include "engine/io/model_config.h"
#include "engine/model/machine_probe.h"
#include "engine/placement/kt_rules.h"
#include "engine/train/training_plan.h"
#include "engine/train/training_run.h"
#include "tests/ui/ui_test_support.h"
#include "ui/placement_editor.h"

namespace tandem::ui {

namespace fs = std::filesystem;

class PlacementTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void roundTripsARuleFile();
  void refusesWhatDoesNotFit();
  void showsTheResidentExperts();
  void aPlacementFromTheEditorTrains();

 private:
  // A rule file has no resident-expert counts (the YAML's gpu_experts sets them; the planner
  // places them again): what the engine's reader returns is the placement without them.
  static placement::Placement withoutResidentExperts(placement::Placement p) {
    for (placement::ModulePlacement& m : p.modules) m.gpu_experts = 0;
    return p;
  }

  // This machine's RAM and NUMA nodes with a 24 GB card, and a CPU with AVX-512 BF16 whatever
  // this one has: the planner then picks avx512_bf16 for the experts on every host, so an edit
  // to `generic` is a change (on an AVX2-only host the planner's own choice is generic).
  static placement::Hardware withA24GbCard() {
    placement::Hardware hardware = model::probeMachine();
    hardware.cpu.avx2 = hardware.cpu.avx512 = hardware.cpu.avx512_bf16 = true;
    placement::GpuSpec card;
    card.name = "a 24 GB card";
    card.total_bytes = card.free_bytes = 24ull << 30;
    hardware.gpus = {card};
    return hardware;
  }

  std::vector<int> rowsOf(const placement::Placement& p, placement::ModuleKind kind) {
    std::vector<int> rows;
    for (int i = 0; i < static_cast<int>(p.modules.size()); ++i) {
      if (p.modules[i].kind == kind) rows.push_back(i);
    }
    return rows;
  }

  QTemporaryDir tmp_;
  StudioPaths paths_;
  io::ModelConfig model_;
  placement::PlanRequest request_;
};

void PlacementTest::initTestCase() {
  QVERIFY(tmp_.isValid());
  paths_ = test::demoPaths(tmp_);
  const train::TrainConfig config =
      test::demoConfig(paths_, fs::path(tmp_.path().toStdString()) / "out");
  model_ = io::readModelConfig(config.model_name_or_path);
  request_ = train::planRequestFor(config, model_);
}

void PlacementTest::roundTripsARuleFile() {
  const placement::Hardware hardware = withA24GbCard();
  PlacementEditor editor(request_, hardware);
  QVERIFY2(editor.problem().isEmpty(), qPrintable(editor.problem()));
  QCOMPARE(editor.moduleCount(), static_cast<int>(placement::modulesOf(model_).modules.size()));
  // An edit: the routed experts on the generic backend.
  const std::vector<int> experts = rowsOf(editor.placement(), placement::ModuleKind::RoutedExperts);
  QCOMPARE(experts.size(), size_t{4});
  QVERIFY2(editor.assign(experts, QStringLiteral("cpu"), QStringLiteral("generic")),
           qPrintable(editor.problem()));
  for (int row : experts) QCOMPARE(editor.placement().modules[row].backend, std::string("generic"));

  const fs::path first = fs::path(tmp_.path().toStdString()) / "rules1.yaml";
  QVERIFY(editor.exportRules(first));
  QVERIFY(editor.placement().modules[experts.front()].gpu_experts > 0);
  // The engine's reader:
  QVERIFY(placement::loadPlacementFile(first, model_) ==
          withoutResidentExperts(editor.placement()));

  PlacementEditor second(request_, hardware);
  QVERIFY(!(second.placement() == editor.placement()));  // the planner's own choice differs
  QVERIFY2(second.importRules(first), qPrintable(second.problem()));
  QVERIFY(second.placement() == editor.placement());
  const fs::path again = fs::path(tmp_.path().toStdString()) / "rules2.yaml";
  QVERIFY(second.exportRules(again));
  QVERIFY(placement::loadPlacementFile(again, model_) ==
          withoutResidentExperts(editor.placement()));
}

void PlacementTest::refusesWhatDoesNotFit() {
  placement::Hardware hardware = withA24GbCard();
  hardware.name = "a machine with a 4 MiB GPU";
  hardware.gpus.front().name = "tiny";
  hardware.gpus.front().total_bytes = hardware.gpus.front().free_bytes = 4ull << 20;
  PlacementEditor editor(request_, hardware);
  const placement::Placement before = editor.placement();
  std::vector<int> all(editor.moduleCount());
  for (int i = 0; i < editor.moduleCount(); ++i) all[i] = i;
  // Everything dense on the 4 MiB GPU: the demo's weights alone are larger.
  std::vector<int> dense;
  for (int i : all) {
    if (before.modules[i].kind != placement::ModuleKind::RoutedExperts) dense.push_back(i);
  }
  QVERIFY(!editor.assign(dense, QStringLiteral("cuda:0")));
  QVERIFY2(editor.problem().contains(QStringLiteral("cuda:0")), qPrintable(editor.problem()));
  QVERIFY(editor.placement() == before);
  // A device the machine does not have is refused too.
  QVERIFY(!editor.assign({0}, QStringLiteral("cuda:3")));
  QVERIFY(editor.placement() == before);
}

// On a 24 GB card the planner keeps every routed expert of the small demo model resident: the
// routed-experts rows say how many of how many, and on which GPU.
void PlacementTest::showsTheResidentExperts() {
  const placement::Hardware hardware = withA24GbCard();
  PlacementEditor editor(request_, hardware);
  QVERIFY2(editor.problem().isEmpty(), qPrintable(editor.problem()));
  auto* table = editor.findChild<QTableWidget*>();
  QVERIFY(table);
  int device_column = -1;
  for (int c = 0; c < table->columnCount(); ++c) {
    if (table->horizontalHeaderItem(c)->text() == QStringLiteral("Device")) device_column = c;
  }
  QVERIFY(device_column >= 0);
  const std::vector<int> experts = rowsOf(editor.placement(), placement::ModuleKind::RoutedExperts);
  QVERIFY(!experts.empty());
  for (int row : experts) {
    const int64_t n = editor.placement().modules[row].gpu_experts;
    QCOMPARE(n, model_.num_experts);
    QCOMPARE(table->item(row, device_column)->text(),
             QStringLiteral("cpu + %1 of %1 experts on cuda:0").arg(model_.num_experts));
  }
  // Layer 0 moved to the CPU keeps no experts on a GPU; the other layers keep theirs.
  std::vector<int> layer0;
  for (int i = 0; i < editor.moduleCount(); ++i) {
    const placement::ModulePlacement& m = editor.placement().modules[i];
    if (m.layer == 0 && m.kind != placement::ModuleKind::RoutedExperts) layer0.push_back(i);
  }
  QVERIFY2(editor.assign(layer0, QStringLiteral("cpu")), qPrintable(editor.problem()));
  QCOMPARE(table->item(experts.front(), device_column)->text(), QStringLiteral("cpu"));
  QCOMPARE(editor.placement().modules[experts.front()].gpu_experts, int64_t{0});
  QCOMPARE(table->item(experts.back(), device_column)->text(),
           QStringLiteral("cpu + %1 of %1 experts on cuda:0").arg(model_.num_experts));
}

// What the review page does with the editor: export its placement as a rule file beside the
// output, point the config's placement_rule at it, train. The edit moves decoder layer 1 to
// cpu:numa0, a device of its own to libtorch (the CPU build's second device), so the run that
// follows the file differs from the planner's own; the engine must run exactly what was edited.
void PlacementTest::aPlacementFromTheEditorTrains() {
  const placement::Hardware hardware = model::probeMachine();
  PlacementEditor editor(request_, hardware);
  QVERIFY2(editor.problem().isEmpty(), qPrintable(editor.problem()));
  std::vector<int> layer1;
  for (int i = 0; i < editor.moduleCount(); ++i) {
    const placement::ModulePlacement& m = editor.placement().modules[i];
    if (m.layer == 1 && m.kind != placement::ModuleKind::RoutedExperts) layer1.push_back(i);
  }
  QVERIFY(!layer1.empty());
  QVERIFY2(editor.assign(layer1, QStringLiteral("cpu:numa0")), qPrintable(editor.problem()));
  const fs::path out = fs::path(tmp_.path().toStdString()) / "edited";
  const fs::path rule = fs::path(tmp_.path().toStdString()) / "edited_kt_rule.yaml";
  QVERIFY2(editor.exportRules(rule), qPrintable(editor.problem()));

  const train::TrainConfig config =
      test::demoConfig(paths_, out, {"max_steps=2", "placement_rule=" + rule.string()});
  TrainListener quiet;
  const train::TrainingRunOutcome outcome =
      train::runTraining(config, quiet, train::RunControl{}, nullptr);
  QCOMPARE(outcome.result.outcome, TrainOutcome::Completed);
  QCOMPARE(outcome.result.steps, int64_t{2});
  QVERIFY(fs::exists(out / "adapter_model.safetensors"));

  const std::vector<placement::Device> edited = editor.placement().layerDevices();
  QCOMPARE(outcome.applied_placement.layers, edited);
  QCOMPARE(outcome.applied_placement.layers[1], placement::Device::numaNode(0));
  QCOMPARE(outcome.applied_placement.embed, editor.placement().find("model.embed_tokens")->device);
  QCOMPARE(outcome.applied_placement.head, editor.placement().find("lm_head")->device);
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::PlacementTest)
#include "studio_placement_test.moc"
