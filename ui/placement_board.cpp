#include "ui/placement_board.h"

#include <QAction>
#include <QDialogButtonBox>
#include <QFileDialog>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QSlider>
#include <QSplitter>
#include <QTableView>
#include <QToolButton>
#include <QVBoxLayout>
#include <set>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/io/atomic_file.h"
#include "engine/placement/kt_rules.h"
#include "ui/error_text.h"
#include "ui/memory_map.h"
#include "ui/placement_board_model.h"
#include "ui/placement_editor.h"
#include "ui/theme.h"

namespace tandem::ui {

namespace {

QString joined(const std::vector<std::string>& lines, const QString& separator) {
  QStringList out;
  for (const std::string& l : lines) out << QString::fromStdString(l);
  return out.join(separator);
}

QToolButton* toolButton(QAction* action) {
  auto* button = new QToolButton;
  button->setDefaultAction(action);
  button->setToolButtonStyle(Qt::ToolButtonTextOnly);
  return button;
}

// The cost model's figure for the board's plan (issue 28): this placement's mode, the per-expert
// split's, and each resource's busy time under the split.
QString costModelText(const placement::StepPrediction& p, const std::string& mode,
                      const placement::MachineRates& rates) {
  auto count = [](double v) {
    return QString::fromStdString(formatCount(static_cast<uint64_t>(v)));
  };
  auto ms = [](double v) { return QString::number(v, 'g', 3); };
  const placement::ModePrediction* planned = p.mode(mode);
  const double planned_tps = planned && planned->available ? planned->tokens_per_s : 0;
  return QObject::tr(
             "≈ %1 tokens/s for this placement (%2), %3 at most with the per-expert split "
             "(CPU %4 ms, copies %5 ms, GPU %6 ms busy a step); cost model from %7, "
             "balanced routing")
      .arg(count(planned_tps), QString::fromStdString(mode), count(p.lower_bound_tokens_per_s),
           ms(p.split.cpu_busy_ms), ms(p.split.copy_busy_ms), ms(p.split.gpu_busy_ms),
           QString::fromStdString(rates.source));
}

}  // namespace

PlacementBoard::PlacementBoard(placement::PlanRequest request, placement::Hardware hardware,
                               placement::Placement initial, QWidget* parent)
    : QDialog(parent) {
  setWindowTitle(tr("Placement board — %1").arg(QString::fromStdString(hardware.name)));
  model_ = new PlacementBoardModel(std::move(request), std::move(hardware), this);

  view_ = new QTableView;
  view_->setModel(model_);
  view_->setAccessibleName(tr("Placement board"));
  view_->setSelectionMode(QAbstractItemView::ExtendedSelection);
  view_->setDragEnabled(true);
  view_->setAcceptDrops(true);
  view_->setDropIndicatorShown(true);
  view_->setDragDropMode(QAbstractItemView::DragDrop);
  view_->setDefaultDropAction(Qt::MoveAction);
  view_->setDragDropOverwriteMode(true);
  view_->setEditTriggers(QAbstractItemView::DoubleClicked | QAbstractItemView::EditKeyPressed);
  view_->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  view_->horizontalHeader()->setSectionResizeMode(model_->gpuExpertsColumn(), QHeaderView::Fixed);
  view_->horizontalHeader()->resizeSection(model_->gpuExpertsColumn(), 190);
  view_->setWordWrap(true);
  view_->verticalHeader()->setDefaultSectionSize(2 * view_->fontMetrics().lineSpacing() + 8);

  // Per MoE layer: its "experts on GPU" slider and the count beside it.
  const int layers = model_->request().model.num_hidden_layers;
  layer_sliders_.assign(static_cast<size_t>(layers), nullptr);
  layer_counts_.assign(static_cast<size_t>(layers), nullptr);
  for (int layer = 0; layer < layers; ++layer) {
    if (!model_->request().model.isMoeLayer(layer)) continue;
    auto* cell = new QWidget;
    cell->setAutoFillBackground(true);  // the view paints nothing beneath it
    auto* row = new QHBoxLayout(cell);
    row->setContentsMargins(4, 0, 4, 0);
    auto* slider = new QSlider(Qt::Horizontal);
    slider->setRange(0, static_cast<int>(model_->maxGpuExperts()));
    slider->setAccessibleName(tr("Layer %1: routed experts on its GPU").arg(layer));
    auto* count = new QLabel;
    count->setMinimumWidth(QFontMetrics(count->font()).horizontalAdvance(QStringLiteral("0000")));
    row->addWidget(slider, 1);
    row->addWidget(count);
    view_->setIndexWidget(model_->index(model_->layerRow(layer), model_->gpuExpertsColumn()), cell);
    connect(slider, &QSlider::valueChanged, this, [this, layer](int value) {
      if (!model_->setGpuExperts(model_->layerRow(layer), value)) refresh();
    });
    layer_sliders_[static_cast<size_t>(layer)] = slider;
    layer_counts_[static_cast<size_t>(layer)] = count;
  }

  QUndoStack* undo = model_->undoStack();
  QAction* undo_action = undo->createUndoAction(this, tr("&Undo"));
  undo_action->setShortcut(QKeySequence::Undo);
  QAction* redo_action = undo->createRedoAction(this, tr("&Redo"));
  redo_action->setShortcut(QKeySequence::Redo);
  addAction(undo_action);
  addAction(redo_action);
  auto addMove = [this](const QKeySequence& keys, bool experts, int step) {
    auto* action = new QAction(this);
    action->setShortcut(keys);
    action->setShortcutContext(Qt::WidgetWithChildrenShortcut);
    connect(action, &QAction::triggered, this,
            [this, experts, step] { moveSelected(experts, step); });
    addAction(action);
  };
  addMove(QKeySequence(Qt::CTRL | Qt::Key_Left), false, -1);
  addMove(QKeySequence(Qt::CTRL | Qt::Key_Right), false, +1);
  addMove(QKeySequence(Qt::ALT | Qt::Key_Left), true, -1);
  addMove(QKeySequence(Qt::ALT | Qt::Key_Right), true, +1);

  auto* auto_button = new QPushButton(tr("A&uto (planner)"));
  auto_button->setToolTip(
      tr("The memory planner's placement: GPUs filled by arithmetic intensity, then with the most "
         "routed experts"));
  auto* import_button = new QPushButton(tr("&Import rule file…"));
  auto* export_button = new QPushButton(tr("&Export rule file…"));
  auto* modules_button = new QPushButton(tr("&Module list…"));
  modules_button->setToolTip(tr("Every module with its device, backend and format"));
  auto* tools = new QHBoxLayout;
  tools->addWidget(toolButton(undo_action));
  tools->addWidget(toolButton(redo_action));
  tools->addStretch(1);
  tools->addWidget(auto_button);
  tools->addWidget(modules_button);
  tools->addWidget(import_button);
  tools->addWidget(export_button);

  global_ = new QSlider(Qt::Horizontal);
  global_->setRange(0, static_cast<int>(model_->maxGpuExperts()));
  global_->setAccessibleName(tr("Routed experts on the GPU, every layer on a GPU"));
  global_count_ = new QLabel;
  auto* global_row = new QHBoxLayout;
  global_row->addWidget(new QLabel(tr("Experts on GPU, every layer on a GPU:")));
  global_row->addWidget(global_, 1);
  global_row->addWidget(global_count_);
  connect(global_, &QSlider::valueChanged, this, [this](int value) {
    if (!model_->setAllGpuExperts(value)) refresh();
  });
  global_->setEnabled(model_->request().model.isMoe() && !model_->hardware().gpus.empty());

  fit_ = new QLabel;
  fit_->setObjectName(QStringLiteral("fitBadge"));
  fit_->setWordWrap(true);
  speed_ = new QLabel;
  speed_->setObjectName(QStringLiteral("speed"));
  speed_->setWordWrap(true);
  status_ = new QLabel;
  status_->setWordWrap(true);
  map_ = new MemoryMapWidget;
  auto* plan_box = new QGroupBox(tr("Plan of this placement"));
  auto* plan_layout = new QVBoxLayout(plan_box);
  plan_layout->addLayout(global_row);
  plan_layout->addWidget(fit_);
  plan_layout->addWidget(speed_);
  plan_layout->addWidget(map_);
  plan_layout->addWidget(status_);
  plan_layout->addStretch(1);

  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  auto* split = new QSplitter(Qt::Vertical);
  split->addWidget(view_);
  split->addWidget(plan_box);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 2);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(tools);
  layout->addWidget(split, 1);
  layout->addWidget(buttons);
  resize(1100, 760);

  connect(model_, &PlacementBoardModel::planChanged, this, &PlacementBoard::refresh);
  connect(model_, &PlacementBoardModel::editRefused, this,
          [this] { showProblem(model_->problem()); });
  connect(auto_button, &QPushButton::clicked, model_, &PlacementBoardModel::autoPlace);
  connect(modules_button, &QPushButton::clicked, this, &PlacementBoard::openModuleList);
  connect(import_button, &QPushButton::clicked, this, [this] {
    const QString file = QFileDialog::getOpenFileName(
        this, tr("KTransformers rule file or placement preset"), {}, tr("YAML (*.yaml *.yml)"));
    if (!file.isEmpty()) importRules(file.toStdString());
  });
  connect(export_button, &QPushButton::clicked, this, [this] {
    const QString file = QFileDialog::getSaveFileName(this, tr("KTransformers rule file"), {},
                                                      tr("YAML (*.yaml *.yml)"));
    if (!file.isEmpty()) exportRules(file.toStdString());
  });

  try {
    model_->reset(initial);
  } catch (const Error& e) {
    // A rule file the planner cannot evaluate: say why and start from the planner's own.
    const QString why = errorText(e);
    try {
      model_->reset();
    } catch (const Error& planner) {
      showProblem(errorText(planner));
      return;
    }
    showProblem(why);
  }
}

const placement::Placement& PlacementBoard::placement() const { return model_->placement(); }
const placement::MemoryPlan& PlacementBoard::plan() const { return model_->plan(); }
QString PlacementBoard::problem() const { return problem_; }

QSlider* PlacementBoard::layerSlider(int layer) const {
  return layer >= 0 && layer < static_cast<int>(layer_sliders_.size())
             ? layer_sliders_[static_cast<size_t>(layer)]
             : nullptr;
}

void PlacementBoard::showProblem(const QString& problem) {
  problem_ = problem;
  status_->setStyleSheet(problemStyleSheet(palette()));
  status_->setText(tr("Refused — %1").arg(problem));
}

void PlacementBoard::refresh() {
  const placement::MemoryPlan& plan = model_->plan();
  problem_.clear();
  status_->setStyleSheet({});
  status_->setText(joined(plan.notes, QStringLiteral("\n")));
  fit_->setStyleSheet(plan.fits
                          ? QStringLiteral("color: white; background: #1b7f3b; padding: 4px;")
                          : QStringLiteral("color: white; background: #b00020; padding: 4px;"));
  fit_->setText(plan.fits
                    ? tr("Fits")
                    : tr("Does not fit: %1").arg(joined(plan.problems, QStringLiteral("; "))) +
                          (plan.advice.empty()
                               ? QString()
                               : QStringLiteral("\n") + joined(plan.advice, QStringLiteral("\n"))));
  if (const auto& p = model_->prediction()) {
    speed_->setText(costModelText(*p, model_->plannedMode(), model_->rates()));
  } else if (const auto& e = model_->estimate()) {
    auto ms = [](double v) { return QString::number(v, 'g', 3); };
    speed_->setText(
        tr("≈ %1 tokens/s at most: the CPU side takes %2 ms a step (expert engine "
           "%3 ms, dense modules on the CPU %4 ms, streamed experts %5 ms); the GPUs' "
           "compute is not counted")
            .arg(QString::fromStdString(formatCount(static_cast<uint64_t>(e->tokens_per_s))))
            .arg(ms(e->step_ms), ms(e->expert_engine_ms), ms(e->cpu_dense_ms), ms(e->streamed_ms)));
  } else {
    speed_->setText(
        tr("tokens/s: no estimate (the rates measured are for AMX CPUs and known PCIe "
           "links, and this placement leaves the CPU nothing to compute or has none)"));
  }
  map_->setBars(plannedMemoryBars(plan));
  // The sliders show the plan; setting them is not an edit.
  int64_t common = -1;
  bool same = true;
  for (size_t layer = 0; layer < layer_sliders_.size(); ++layer) {
    QSlider* slider = layer_sliders_[layer];
    if (!slider) continue;
    const int row = model_->layerRow(static_cast<int>(layer));
    const int64_t n = model_->gpuExperts(row);
    const QSignalBlocker block(slider);
    slider->setValue(static_cast<int>(n));
    slider->setEnabled(model_->canHoldGpuExperts(row));
    layer_counts_[layer]->setText(model_->canHoldGpuExperts(row) ? QString::number(n) : tr("cpu"));
    if (model_->canHoldGpuExperts(row)) {
      same = same && (common < 0 || common == n);
      common = n;
    }
  }
  const QSignalBlocker block(global_);
  global_->setValue(static_cast<int>(std::max<int64_t>(common, 0)));
  global_count_->setText(common < 0 ? tr("no layer on a GPU")
                         : same     ? QString::number(common)
                                    : tr("mixed"));
}

std::vector<int> PlacementBoard::selectedRows() const {
  std::set<int> rows;
  for (const QModelIndex& i : view_->selectionModel()->selectedIndexes()) rows.insert(i.row());
  if (rows.empty() && view_->currentIndex().isValid()) rows.insert(view_->currentIndex().row());
  return {rows.begin(), rows.end()};
}

bool PlacementBoard::moveSelected(bool experts, int step) {
  const std::vector<int> rows = selectedRows();
  if (rows.empty()) return false;
  const std::vector<placement::Device>& devices = model_->devices();
  const int row = rows.front();
  int column = -1;
  if (experts) {
    const std::optional<placement::Device> at = model_->expertsDevice(row);
    if (!at) return false;
    column = model_->columnOf(*at);
  } else {
    column = model_->columnOf(model_->denseDevice(row));
  }
  for (int c = column + step; c >= 0 && c < static_cast<int>(devices.size()); c += step) {
    if (experts && !devices[static_cast<size_t>(c)].isCpu()) continue;
    return model_->move(
        rows, experts ? PlacementBoardModel::Part::Experts : PlacementBoardModel::Part::Dense,
        devices[static_cast<size_t>(c)]);
  }
  return false;
}

bool PlacementBoard::importRules(const std::filesystem::path& file) {
  try {
    return model_->setPlacement(
        placement::loadPlacementFile(file, model_->request().model),
        tr("Import %1").arg(QString::fromStdString(file.filename().string())));
  } catch (const Error& e) {
    showProblem(errorText(e));
    return false;
  }
}

bool PlacementBoard::exportRules(const std::filesystem::path& file) {
  try {
    io::writeFileAtomically(file,
                            placement::writeKtRules(model_->placement(), model_->request().model));
    return true;
  } catch (const Error& e) {
    showProblem(errorText(e));
    return false;
  }
}

void PlacementBoard::openModuleList() {
  PlacementEditor editor(model_->request(), model_->hardware(), model_->placement(), this);
  if (editor.exec() == QDialog::Accepted)
    model_->setPlacement(editor.placement(), tr("Module list"));
}

}  // namespace tandem::ui
