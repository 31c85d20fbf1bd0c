// The placement editor on the demo model with the real planner: a KTransformers rule file
// exported by the editor reads back (in a second editor and through the engine's own reader) as
// the same placement, edits included; and an edit that cannot fit is refused with the reason,
// leaving the placement as it was. The machine is the probed host with a 24 GB card in place of
// its GPUs, so the tests see the same placements on CI and on a workstation with a GPU; the one
// that trains uses the host as it is, since the run happens here. The placement board (the
// wizard's placement step) on a two-GPU, two-node preset: drags, sliders and keyboard moves
// replan at once (checked against the planner's own evaluation), undo and redo restore each
// state, rule files round-trip with the per-layer counts, and a board placement trains as shown.

#include <QHeaderView>
#include <QLabel>
#include <QMimeData>
#include <QSlider>
#include <QTableView>
#include <QTableWidget>
#include <QTest>
#include <memory>

#include "engine/io/atomic_file.h"
#include "engine/io/model_config.h"
#include "engine/model/machine_probe.h"
#include "engine/placement/kt_rules.h"
#include "engine/placement/step_time_estimate.h"
#include "engine/train/training_plan.h"
#include "engine/train/training_run.h"
#include "tests/ui/ui_test_support.h"
#include "ui/placement_board.h"
#include "ui/placement_board_model.h"
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
  void theBoardReplansAsYouEditAndUndoes();
  void theBoardRoundTripsARuleFile();
  void aPlacementFromTheBoardTrains();

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
  placement::PlanRequest auto_request_;  // the same with experts_mode auto
};

void PlacementTest::initTestCase() {
  QVERIFY(tmp_.isValid());
  paths_ = test::demoPaths(tmp_);
  const train::TrainConfig config =
      test::demoConfig(paths_, fs::path(tmp_.path().toStdString()) / "out");
  model_ = io::readModelConfig(config.model_name_or_path);
  request_ = train::planRequestFor(config, model_);
  // experts_mode auto labels the split, not the fixed mode its placement looks like.
  train::TrainConfig with_auto = config;
  with_auto.experts_mode = "auto";
  auto_request_ = train::planRequestFor(with_auto, model_);
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

namespace {

using placement::Device;

// Two 24 GB GPUs and two 56-core Sapphire Rapids nodes with AMX (a preset, so every host sees
// the same board and the step-time estimate has its measured rates).
placement::Hardware twoGpusTwoNodes() {
  return placement::resolveHardware("2x4090-24g_xeon-spr-2s_512g",
                                    std::filesystem::path(TANDEM_PRESETS_DIR) / "hardware");
}

const placement::ModulePlacement& expertsOf(const placement::Placement& p, int layer) {
  return *p.find("model.layers." + std::to_string(layer) + ".mlp.experts");
}

// What the board shows: its placement, each device's planned bytes, the tokens/s estimate.
struct BoardState {
  placement::Placement placement;
  std::vector<std::pair<Device, uint64_t>> bytes;
  std::optional<double> tokens_per_s;
  bool fits = false;

  explicit BoardState(const PlacementBoard& board) : placement(board.placement()) {
    for (const placement::DevicePlan& d : board.plan().devices)
      bytes.emplace_back(d.device, d.total());
    if (const auto& e = board.model()->estimate()) tokens_per_s = e->tokens_per_s;
    fits = board.plan().fits;
  }
  uint64_t on(Device device) const {
    for (const auto& [d, b] : bytes) {
      if (d == device) return b;
    }
    return 0;
  }
  bool operator==(const BoardState&) const = default;
};

// A drop as the view makes it: the dragged cells' mime data onto the target cell.
bool drop(PlacementBoardModel* model, int row, int from_column, int to_column) {
  std::unique_ptr<QMimeData> mime(model->mimeData({model->index(row, from_column)}));
  return model->dropMimeData(mime.get(), Qt::MoveAction, -1, -1, model->index(row, to_column));
}

// The board's plan against the engine's own evaluation of the board's placement.
void checkAgainstThePlanner(const PlacementBoard& board) {
  const PlacementBoardModel& m = *board.model();
  const placement::MemoryPlan again =
      placement::evaluatePlacement(m.request(), m.hardware(), board.placement());
  QCOMPARE(again.placement, board.placement());
  QCOMPARE(again.devices.size(), board.plan().devices.size());
  for (size_t i = 0; i < again.devices.size(); ++i)
    QCOMPARE(again.devices[i].total(), board.plan().devices[i].total());
  const auto estimate = placement::estimateStepTime(m.request(), m.hardware(), again);
  QCOMPARE(estimate.has_value(), m.estimate().has_value());
  if (estimate) QCOMPARE(estimate->tokens_per_s, m.estimate()->tokens_per_s);
}

}  // namespace

// The board on two GPUs and two NUMA nodes: the global slider, a layer's slider, a drag and a
// keyboard move each change the placement and the plan (bytes per device, tokens/s), as the
// planner computes them for the board's placement; undo walks back through exactly the states
// before, redo forward again.
void PlacementTest::theBoardReplansAsYouEditAndUndoes() {
  const placement::Hardware hardware = twoGpusTwoNodes();
  PlacementBoard board(request_, hardware);
  PlacementBoardModel* model = board.model();
  QVERIFY2(board.problem().isEmpty(), qPrintable(board.problem()));
  QCOMPARE(model->devices(), (std::vector<Device>{Device::cuda(0), Device::cuda(1), Device::cpu(),
                                                  Device::numaNode(0), Device::numaNode(1)}));
  QCOMPARE(model->rowCount(), model_.num_hidden_layers + 2);
  const int E = static_cast<int>(model_.num_experts);
  // The planner keeps every expert of the small demo on the 24 GB cards: the CPU has nothing to
  // compute, so no rate applies.
  QCOMPARE(expertsOf(board.placement(), 0).gpu_experts, int64_t{E});
  QVERIFY(!model->estimate());
  const BoardState planned(board);

  // The global slider: no layer keeps experts on its GPU; the CPU engine computes every pair.
  board.globalSlider()->setValue(0);
  for (int layer = 0; layer < model_.num_hidden_layers; ++layer) {
    QCOMPARE(expertsOf(board.placement(), layer).gpu_experts, int64_t{0});
    QCOMPARE(board.layerSlider(layer)->value(), 0);
  }
  const BoardState none(board);
  QVERIFY(none.tokens_per_s.has_value());
  QVERIFY(none.on(Device::cuda(0)) < planned.on(Device::cuda(0)));
  QVERIFY(board.speedLabel()->text().contains(QStringLiteral("tokens/s")));
  // The cost model's figure (issue 28): this placement's mode and the per-expert split's.
  QVERIFY(model->prediction().has_value());
  QCOMPARE(model->plannedMode(), std::string("co"));
  QVERIFY(board.speedLabel()->text().contains(QStringLiteral("per-expert split")));
  {  // experts_mode auto on the same machine runs the split: the board says so, not "co"
    PlacementBoard auto_board(auto_request_, hardware);
    QCOMPARE(auto_board.model()->plannedMode(), std::string("split"));
  }
  QVERIFY(model->prediction()->lower_bound_ms <= model->prediction()->mode("co")->step_ms);
  const double co_cpu_experts_ms = model->prediction()->mode("co")->parts.cpu_experts_ms;
  checkAgainstThePlanner(board);

  // Layer 2's slider: half its experts on its GPU. The GPU holds 8 experts more (3 · H · I
  // weights each), and the CPU engine computes 3.5 of the 4 layers' pairs.
  const Device layer2_gpu = model->denseDevice(model->layerRow(2));
  QVERIFY(layer2_gpu.isGpu());
  const double expert_ms_before = model->estimate()->expert_engine_ms;
  board.layerSlider(2)->setValue(E / 2);
  QCOMPARE(expertsOf(board.placement(), 2).gpu_experts, int64_t{E / 2});
  QCOMPARE(expertsOf(board.placement(), 1).gpu_experts, int64_t{0});
  const uint64_t expert_bytes = uint64_t{3} * static_cast<uint64_t>(model_.hidden_size) *
                                static_cast<uint64_t>(model_.moe_intermediate_size) *
                                (request_.bf16 ? 2 : 4);
  uint64_t resident = 0;
  for (const placement::PlanItem& item : board.plan().device(layer2_gpu)->items)
    resident += item.what == "resident routed experts" ? item.bytes : 0;
  QCOMPARE(resident, static_cast<uint64_t>(E / 2) * expert_bytes);
  QVERIFY(qFuzzyCompare(model->estimate()->expert_engine_ms, expert_ms_before * 3.5 / 4));
  QCOMPARE(model->plannedMode(), std::string("resident"));
  QVERIFY(model->prediction()->mode("resident")->parts.cpu_experts_ms < co_cpu_experts_ms);
  const BoardState half(board);
  QVERIFY(*half.tokens_per_s > *none.tokens_per_s);
  QCOMPARE(board.globalSlider()->isEnabled(), true);
  checkAgainstThePlanner(board);

  // Drag layer 1's attention and router from its GPU to NUMA node 0: node 0 holds it, its GPU no
  // longer does, and the CPU now computes its dense part too.
  const int row1 = model->layerRow(1);
  const Device layer1_gpu = model->denseDevice(row1);
  QVERIFY(drop(model, row1, model->columnOf(layer1_gpu), model->columnOf(Device::numaNode(0))));
  QCOMPARE(model->denseDevice(row1), Device::numaNode(0));
  QCOMPARE(board.placement().layerDevices()[1], Device::numaNode(0));
  QVERIFY(!board.layerSlider(1)->isEnabled());
  const BoardState dragged(board);
  QVERIFY(dragged.on(layer1_gpu) < half.on(layer1_gpu));
  QVERIFY(dragged.on(Device::numaNode(0)) > half.on(Device::numaNode(0)));
  QVERIFY(model->estimate()->cpu_dense_ms > 0);
  QVERIFY(*dragged.tokens_per_s < *half.tokens_per_s);
  checkAgainstThePlanner(board);

  // The keyboard's move: Ctrl+Right takes layer 3's dense part one column right.
  board.show();
  QVERIFY(QTest::qWaitForWindowExposed(&board));
  const int row3 = model->layerRow(3);
  const int column3 = model->columnOf(model->denseDevice(row3));
  board.view()->setFocus();
  board.view()->setCurrentIndex(model->index(row3, column3));
  QTest::keyClick(board.view(), Qt::Key_Right, Qt::ControlModifier);
  QCOMPARE(model->denseDevice(row3), model->devices()[static_cast<size_t>(column3 + 1)]);
  // A drop of experts on a GPU column is no move, and an experts move to a GPU is refused.
  QVERIFY(!model->move({row1}, PlacementBoardModel::Part::Experts, Device::cuda(0)));
  QVERIFY(board.problem().contains(QStringLiteral("host memory")));

  // Undo: back through each state exactly; redo: forward again.
  QUndoStack* undo = model->undoStack();
  undo->undo();
  QCOMPARE(BoardState(board), dragged);
  undo->undo();
  QCOMPARE(BoardState(board), half);
  QVERIFY(board.layerSlider(1)->isEnabled());
  undo->undo();
  QCOMPARE(BoardState(board), none);
  QCOMPARE(board.layerSlider(2)->value(), 0);
  undo->undo();
  QCOMPARE(BoardState(board), planned);
  QVERIFY(!undo->canUndo());
  undo->redo();
  undo->redo();
  undo->redo();
  QCOMPARE(BoardState(board), dragged);
  checkAgainstThePlanner(board);
}

// Export → import: the rule file carries the board's devices and its per-layer expert counts;
// the engine's reader gives the board's placement back, and so does a second board.
void PlacementTest::theBoardRoundTripsARuleFile() {
  const placement::Hardware hardware = twoGpusTwoNodes();
  PlacementBoard board(request_, hardware);
  PlacementBoardModel* model = board.model();
  board.globalSlider()->setValue(5);
  board.layerSlider(0)->setValue(3);
  const int row2 = model->layerRow(2);
  QVERIFY(model->move({row2}, PlacementBoardModel::Part::Experts, Device::numaNode(1)));
  QCOMPARE(*model->expertsDevice(row2), Device::numaNode(1));
  QVERIFY(model->move({model->layerRow(3)}, PlacementBoardModel::Part::Dense, Device::cuda(0)));

  const fs::path file = fs::path(tmp_.path().toStdString()) / "board_rules.yaml";
  QVERIFY2(board.exportRules(file), qPrintable(board.problem()));
  QCOMPARE(placement::loadPlacementFile(file, model_), board.placement());
  QCOMPARE(expertsOf(board.placement(), 0).gpu_experts, int64_t{3});
  QCOMPARE(expertsOf(board.placement(), 1).gpu_experts, int64_t{5});

  PlacementBoard second(request_, hardware);
  QVERIFY(!(second.placement() == board.placement()));
  QVERIFY2(second.importRules(file), qPrintable(second.problem()));
  QCOMPARE(BoardState(second), BoardState(board));
  second.model()->undoStack()->undo();  // the import is an edit like any other
  QVERIFY(!(second.placement() == board.placement()));

  // A placement from the module list with layer 0 moved to the host: its fixed count goes with
  // the GPU it left, as a drag there would have it.
  placement::Placement edited = second.placement();
  for (placement::ModulePlacement& m : edited.modules) {
    if (m.layer == 0 && m.kind != placement::ModuleKind::RoutedExperts) m.device = Device::cpu();
  }
  QVERIFY(expertsOf(edited, 0).gpu_experts > 0);
  QVERIFY2(second.model()->setPlacement(edited, QStringLiteral("Module list")),
           qPrintable(second.problem()));
  QCOMPARE(second.placement().layerDevices()[0], Device::cpu());
  QCOMPARE(expertsOf(second.placement(), 0).gpu_experts, int64_t{0});

  // A rule file the planner refuses changes nothing.
  const fs::path bad = fs::path(tmp_.path().toStdString()) / "bad_rules.yaml";
  io::writeFileAtomically(bad,
                          "- match: {name: \"^model\\\\.layers\\\\.0\\\\.self_attn$\"}\n"
                          "  replace: {class: default, kwargs: {prefill_device: \"cuda:7\"}}\n");
  const BoardState before(second);
  QVERIFY(!second.importRules(bad));
  QVERIFY2(second.problem().contains(QStringLiteral("cuda:7")), qPrintable(second.problem()));
  QCOMPARE(BoardState(second), before);
}

// The review page's path with the board: export beside the output, point placement_rule at it,
// train. Layer 1 dragged to NUMA node 0's column (a device of its own to the CPU build's
// runtime): the engine must run what the board shows, layer by layer, resident experts included.
void PlacementTest::aPlacementFromTheBoardTrains() {
  PlacementBoard board(request_, model::probeMachine());
  QVERIFY2(board.problem().isEmpty(), qPrintable(board.problem()));
  PlacementBoardModel* model = board.model();
  const int row1 = model->layerRow(1);
  QVERIFY(drop(model, row1, model->columnOf(model->denseDevice(row1)),
               model->columnOf(Device::numaNode(0))));
  QCOMPARE(board.placement().layerDevices()[1], Device::numaNode(0));
  const fs::path out = fs::path(tmp_.path().toStdString()) / "from_board";
  const fs::path rule = fs::path(tmp_.path().toStdString()) / "from_board_kt_rule.yaml";
  QVERIFY2(board.exportRules(rule), qPrintable(board.problem()));

  const train::TrainConfig config =
      test::demoConfig(paths_, out, {"max_steps=2", "placement_rule=" + rule.string()});
  TrainListener quiet;
  const train::TrainingRunOutcome outcome =
      train::runTraining(config, quiet, train::RunControl{}, nullptr);
  QCOMPARE(outcome.result.outcome, TrainOutcome::Completed);
  QCOMPARE(outcome.result.steps, int64_t{2});

  QCOMPARE(outcome.applied_placement.layers, board.placement().layerDevices());
  QCOMPARE(outcome.applied_placement.embed, board.placement().find("model.embed_tokens")->device);
  QCOMPARE(outcome.applied_placement.head, board.placement().find("lm_head")->device);
  std::vector<int64_t> resident;
  for (int layer = 0; layer < model_.num_hidden_layers; ++layer)
    resident.push_back(model->gpuExperts(model->layerRow(layer)));
  QCOMPARE(outcome.applied_placement.resident_experts, resident);
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::PlacementTest)
#include "studio_placement_test.moc"
