#include "ui/placement_board_model.h"

#include <QBrush>
#include <QColor>
#include <QMimeData>
#include <QUndoCommand>
#include <algorithm>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/placement/plan_step_cost.h"
#include "ui/error_text.h"

namespace tandem::ui {

namespace {

// The cost model's step for `plan`; nullopt where it has nothing to say (a dense model, no CPU
// expert rate for this machine, a plan it cannot read).
std::optional<placement::StepPrediction> predictPlan(const placement::PlanRequest& request,
                                                     const placement::MemoryPlan& plan,
                                                     const placement::MachineRates& rates) {
  if (!request.model.isMoe() || !request.training || rates.cpu.empty()) return std::nullopt;
  try {
    const placement::StepCostRequest r = placement::stepCostRequestFor(request, plan);
    return placement::predictStep(r, rates, placement::balancedRouting(r.model, r.tokens));
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

namespace {

using placement::Device;
using placement::ModuleKind;
using placement::ModulePlacement;

// One edit of the board: the plans before and after it (both evaluated once, when it was made).
// Consecutive moves of one slider merge into one step, as a text editor merges typing.
class BoardEdit : public QUndoCommand {
 public:
  enum Merge { kNoMerge = -1, kLayerSlider = 1, kGlobalSlider = 2 };

  BoardEdit(PlacementBoardModel* model, placement::MemoryPlan before, placement::MemoryPlan after,
            const QString& text, int merge_id, int row)
      : QUndoCommand(text),
        model_(model),
        before_(std::move(before)),
        after_(std::move(after)),
        merge_id_(merge_id),
        row_(row) {}

  void undo() override { model_->show(before_); }
  void redo() override { model_->show(after_); }
  int id() const override { return merge_id_; }
  bool mergeWith(const QUndoCommand* other) override {
    const auto* edit = static_cast<const BoardEdit*>(other);
    if (edit->row_ != row_) return false;
    after_ = edit->after_;
    return true;
  }

 private:
  PlacementBoardModel* model_;
  placement::MemoryPlan before_, after_;
  int merge_id_;
  int row_;
};

// The modules a board row stands for.
bool inRow(const ModulePlacement& m, int layer, int row, int rows) {
  if (row == 0) return m.kind == ModuleKind::Embedding;
  if (row == rows - 1) return m.kind == ModuleKind::FinalNorm || m.kind == ModuleKind::LmHead;
  return m.layer == layer;
}

QString deviceTitle(const placement::Hardware& hw, Device d) {
  if (d.isGpu()) {
    for (const placement::GpuSpec& g : hw.gpus) {
      if (g.device() == d) {
        return QStringLiteral("%1\n%2\n%3")
            .arg(QString::fromStdString(d.str()), QString::fromStdString(g.name),
                 QString::fromStdString(formatBytes(g.total_bytes)));
      }
    }
  }
  if (d.numaNode() < 0) return QObject::tr("cpu\nall NUMA nodes\n(experts split over them)");
  for (const placement::NumaNodeSpec& n : hw.numa_nodes) {
    if (n.id == d.numaNode()) {
      return QObject::tr("cpu:numa%1\nNUMA node %1\n%2 cores, %3")
          .arg(n.id)
          .arg(n.cores)
          .arg(QString::fromStdString(formatBytes(n.total_bytes)));
    }
  }
  return QString::fromStdString(d.str());
}

}  // namespace

PlacementBoardModel::PlacementBoardModel(placement::PlanRequest request,
                                         placement::Hardware hardware, QObject* parent)
    : QAbstractTableModel(parent), request_(std::move(request)), hardware_(std::move(hardware)) {
  rates_ = placement::presetRates(hardware_);
  // Each GPU, the whole host (experts split over its nodes) and each NUMA node: on a one-node
  // machine cpu:numa0 is a device of its own to the runtime (its own torch device object).
  for (const placement::GpuSpec& g : hardware_.gpus) devices_.push_back(g.device());
  devices_.push_back(Device::cpu());
  for (const placement::NumaNodeSpec& n : hardware_.numa_nodes)
    devices_.push_back(Device::numaNode(n.id));
  plan_.placement = placement::modulesOf(request_.model);
}

void PlacementBoardModel::fixGpuExperts(placement::Placement& placement) {
  for (ModulePlacement& m : placement.modules) {
    if (m.kind == ModuleKind::RoutedExperts) m.gpu_experts_fixed = true;
  }
}

std::string PlacementBoardModel::plannedMode() const {
  return placement::plannedMode(request_, plan_, rates_);
}

void PlacementBoardModel::setRates(placement::MachineRates rates) {
  rates_ = std::move(rates);
  prediction_ = predictPlan(request_, plan_, rates_);
  emit planChanged();
}

void PlacementBoardModel::reset(const placement::Placement& placement) {
  placement::MemoryPlan plan = placement.modules.empty()
                                   ? placement::planMemory(request_, hardware_)
                                   : placement::evaluatePlacement(request_, hardware_, placement);
  fixGpuExperts(plan.placement);
  undo_.clear();
  problem_.clear();
  show(plan);
}

void PlacementBoardModel::show(const placement::MemoryPlan& plan) {
  plan_ = plan;
  estimate_ = placement::estimateStepTime(request_, hardware_, plan_);
  prediction_ = predictPlan(request_, plan_, rates_);
  emit dataChanged(index(0, 0), index(rowCount() - 1, columnCount() - 1));
  emit planChanged();
}

int PlacementBoardModel::layerOfRow(int row) const {
  return row >= 1 && row <= request_.model.num_hidden_layers ? row - 1 : -1;
}

int PlacementBoardModel::columnOf(Device device) const {
  const auto it = std::find(devices_.begin(), devices_.end(), device);
  return it == devices_.end() ? -1 : static_cast<int>(it - devices_.begin());
}

Device PlacementBoardModel::denseDevice(int row) const {
  for (const ModulePlacement& m : plan_.placement.modules) {
    if (m.kind != ModuleKind::RoutedExperts && inRow(m, layerOfRow(row), row, rowCount()))
      return m.device;
  }
  return {};
}

std::optional<Device> PlacementBoardModel::expertsDevice(int row) const {
  const int layer = layerOfRow(row);
  for (const ModulePlacement& m : plan_.placement.modules) {
    if (m.kind == ModuleKind::RoutedExperts && layer >= 0 && m.layer == layer) return m.device;
  }
  return std::nullopt;
}

int64_t PlacementBoardModel::gpuExperts(int row) const {
  const int layer = layerOfRow(row);
  for (const ModulePlacement& m : plan_.placement.modules) {
    if (m.kind == ModuleKind::RoutedExperts && layer >= 0 && m.layer == layer) return m.gpu_experts;
  }
  return 0;
}

bool PlacementBoardModel::canHoldGpuExperts(int row) const {
  return expertsDevice(row).has_value() && denseDevice(row).isGpu();
}

std::optional<PlacementBoardModel::Part> PlacementBoardModel::partAt(int row, int column) const {
  if (column < 0 || column >= static_cast<int>(devices_.size())) return std::nullopt;
  if (denseDevice(row) == devices_[static_cast<size_t>(column)]) return Part::Dense;
  if (expertsDevice(row) == devices_[static_cast<size_t>(column)]) return Part::Experts;
  return std::nullopt;
}

std::optional<placement::MemoryPlan> PlacementBoardModel::evaluate(
    const placement::Placement& candidate) {
  try {
    // What the runtime cannot run (a layer split over devices, offloaded experts away from their
    // layer's GPU) is refused here, as training would refuse it. The planner's own placements
    // are the runtime's by construction even where this check is stricter, so it only guards
    // boards that started from one it accepts.
    bool runtime_checked = true;
    try {
      placement::toRuntimePlacement(plan_.placement);
    } catch (const Error&) {
      runtime_checked = false;
    }
    if (runtime_checked) placement::toRuntimePlacement(candidate);
    placement::MemoryPlan plan = placement::evaluatePlacement(request_, hardware_, candidate);
    fixGpuExperts(plan.placement);
    problem_.clear();
    return plan;
  } catch (const Error& e) {
    problem_ = errorText(e);
    emit editRefused();
    return std::nullopt;
  }
}

bool PlacementBoardModel::push(const placement::Placement& candidate, const QString& what,
                               int merge_id) {
  if (candidate == plan_.placement) return true;
  std::optional<placement::MemoryPlan> plan = evaluate(candidate);
  if (!plan) return false;
  int row = -1;
  if (merge_id == BoardEdit::kLayerSlider) {
    for (const ModulePlacement& m : candidate.modules) {
      const ModulePlacement* was = plan_.placement.find(m.name);
      if (m.kind == ModuleKind::RoutedExperts && was && was->gpu_experts != m.gpu_experts)
        row = layerRow(m.layer);
    }
  }
  undo_.push(new BoardEdit(this, plan_, std::move(*plan), what, merge_id, row));
  return true;
}

bool PlacementBoardModel::move(const std::vector<int>& rows, Part part, Device to) {
  placement::Placement candidate = plan_.placement;
  const int n_rows = rowCount();
  if (part == Part::Experts && !to.isCpu()) {
    problem_ =
        tr("Routed experts live in host memory: drop them on a cpu column. The ones a GPU "
           "holds are set with the layer's \"experts on GPU\" slider.");
    emit editRefused();
    return false;
  }
  QStringList names;
  for (int row : rows) {
    if (row < 0 || row >= n_rows) continue;
    const int layer = layerOfRow(row);
    names << headerData(row, Qt::Vertical, Qt::DisplayRole).toString();
    for (ModulePlacement& m : candidate.modules) {
      if (!inRow(m, layer, row, n_rows)) continue;
      const bool experts = m.kind == ModuleKind::RoutedExperts;
      if (part == Part::Experts && experts) m.device = to;
      if (part == Part::Dense && !experts) m.device = to;
      if (part == Part::Dense && experts) {
        // Resident experts live on their layer's GPU: they follow it to another GPU and go back
        // to host memory when the layer leaves the GPUs. Offloaded ones stream to its GPU.
        if (!to.isGpu()) m.gpu_experts = 0;
        if (m.backend == "gpu-offload" && to.isGpu()) m.compute_device = to;
      }
    }
  }
  const QString what = part == Part::Dense ? tr("Move %1 to %2") : tr("Move %1's experts to %2");
  return push(candidate,
              what.arg(names.join(QStringLiteral(", ")), QString::fromStdString(to.str())));
}

bool PlacementBoardModel::setGpuExperts(int row, int64_t count) {
  if (!canHoldGpuExperts(row)) {
    problem_ = tr("%1 is not on a GPU: resident experts live on their layer's GPU; drag its "
                  "attention to a GPU column first")
                   .arg(headerData(row, Qt::Vertical, Qt::DisplayRole).toString());
    emit editRefused();
    return false;
  }
  placement::Placement candidate = plan_.placement;
  const int layer = layerOfRow(row);
  for (ModulePlacement& m : candidate.modules) {
    if (m.kind == ModuleKind::RoutedExperts && m.layer == layer)
      m.gpu_experts = std::clamp<int64_t>(count, 0, maxGpuExperts());
  }
  return push(candidate, tr("Layer %1: experts on GPU").arg(layer), BoardEdit::kLayerSlider);
}

bool PlacementBoardModel::setAllGpuExperts(int64_t count) {
  placement::Placement candidate = plan_.placement;
  const std::vector<Device> layer_device = candidate.layerDevices();
  for (ModulePlacement& m : candidate.modules) {
    if (m.kind == ModuleKind::RoutedExperts && layer_device[static_cast<size_t>(m.layer)].isGpu())
      m.gpu_experts = std::clamp<int64_t>(count, 0, maxGpuExperts());
  }
  return push(candidate, tr("Every layer: experts on GPU"), BoardEdit::kGlobalSlider);
}

bool PlacementBoardModel::setPlacement(const placement::Placement& placement, const QString& what) {
  // The board's rule: resident experts live on their layer's GPU, so a layer another editor put
  // on the host keeps none (as a drag there would leave it).
  placement::Placement candidate = placement;
  const std::vector<Device> layer_device = candidate.layerDevices();
  for (ModulePlacement& m : candidate.modules) {
    if (m.kind == ModuleKind::RoutedExperts && m.gpu_experts_fixed &&
        !layer_device[static_cast<size_t>(m.layer)].isGpu())
      m.gpu_experts = 0;
  }
  return push(candidate, what);
}

bool PlacementBoardModel::autoPlace() {
  try {
    placement::MemoryPlan plan = placement::planMemory(request_, hardware_);
    fixGpuExperts(plan.placement);
    if (plan.placement == plan_.placement) return true;
    undo_.push(new BoardEdit(this, plan_, std::move(plan), tr("Planner's placement"),
                             BoardEdit::kNoMerge, -1));
    return true;
  } catch (const Error& e) {
    problem_ = errorText(e);
    emit editRefused();
    return false;
  }
}

int PlacementBoardModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : request_.model.num_hidden_layers + 2;
}

int PlacementBoardModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(devices_.size()) + 1;
}

QVariant PlacementBoardModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid()) return {};
  const int row = index.row(), column = index.column();
  if (column == gpuExpertsColumn()) {
    if (!expertsDevice(row)) return {};
    // The board shows a slider there; the count is what an editor (F2) starts from.
    if (role == Qt::EditRole && canHoldGpuExperts(row))
      return QVariant::fromValue<qlonglong>(gpuExperts(row));
    if (role == Qt::ToolTipRole)
      return tr("Routed experts resident on the layer's GPU (the most routed), of %1")
          .arg(maxGpuExperts());
    return {};
  }
  const Device device = devices_[static_cast<size_t>(column)];
  const bool dense = denseDevice(row) == device;
  const bool experts = expertsDevice(row) == device;
  const int64_t resident = gpuExperts(row);
  const bool holds_resident = dense && device.isGpu() && resident > 0;
  if (role == Qt::DisplayRole) {
    QStringList parts;
    if (dense) {
      const int layer = layerOfRow(row);
      parts << (layer < 0 ? (row == 0 ? tr("embeddings") : tr("norm + lm_head"))
                : request_.model.isMoeLayer(layer) ? tr("attention + router")
                                                   : tr("attention + MLP"));
    }
    if (holds_resident) parts << tr("+ %1 routed experts").arg(resident);
    if (experts) {
      parts << tr("routed experts\n%1 of %2 computed here")
                   .arg(maxGpuExperts() - resident)
                   .arg(maxGpuExperts());
    }
    return parts.join(QLatin1Char('\n'));
  }
  if (role == Qt::BackgroundRole) {
    if (dense) return QBrush(QColor(0, 114, 178, 70));    // the memory map's weights blue
    if (experts) return QBrush(QColor(230, 159, 0, 80));  // and its cache orange
    return {};
  }
  if (role == Qt::ToolTipRole && (dense || experts)) {
    return tr(
        "Drag to another device column (or Ctrl+Left/Right moves the layer, "
        "Alt+Left/Right its experts between the cpu columns)");
  }
  return {};
}

QVariant PlacementBoardModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (role != Qt::DisplayRole) return {};
  if (orientation == Qt::Horizontal) {
    if (section == gpuExpertsColumn()) return tr("experts on GPU");
    if (section < 0 || section >= static_cast<int>(devices_.size())) return {};
    return deviceTitle(hardware_, devices_[static_cast<size_t>(section)]);
  }
  const int layer = layerOfRow(section);
  if (layer >= 0) return tr("layer %1").arg(layer);
  return section == 0 ? tr("embed") : tr("head");
}

Qt::ItemFlags PlacementBoardModel::flags(const QModelIndex& index) const {
  if (!index.isValid()) return Qt::ItemIsDropEnabled;
  Qt::ItemFlags f = Qt::ItemIsEnabled | Qt::ItemIsSelectable;
  if (index.column() == gpuExpertsColumn())
    return canHoldGpuExperts(index.row()) ? f | Qt::ItemIsEditable : f;
  if (partAt(index.row(), index.column())) f |= Qt::ItemIsDragEnabled;
  return f | Qt::ItemIsDropEnabled;
}

bool PlacementBoardModel::setData(const QModelIndex& index, const QVariant& value, int role) {
  // The view clears a moved item's data after a drop (an invalid value): not an edit.
  if (role != Qt::EditRole || !value.isValid() || index.column() != gpuExpertsColumn())
    return false;
  bool ok = false;
  const qlonglong count = value.toLongLong(&ok);
  return ok && setGpuExperts(index.row(), count);
}

QStringList PlacementBoardModel::mimeTypes() const { return {QString::fromLatin1(kMimeType)}; }

QMimeData* PlacementBoardModel::mimeData(const QModelIndexList& indexes) const {
  // "row dense|experts" per line: what each dragged cell holds.
  QStringList lines;
  for (const QModelIndex& i : indexes) {
    if (const std::optional<Part> part = partAt(i.row(), i.column())) {
      lines << QStringLiteral("%1 %2").arg(i.row()).arg(
          *part == Part::Dense ? QStringLiteral("dense") : QStringLiteral("experts"));
    }
  }
  auto* mime = new QMimeData;
  mime->setData(QString::fromLatin1(kMimeType), lines.join(QLatin1Char('\n')).toUtf8());
  return mime;
}

bool PlacementBoardModel::canDropMimeData(const QMimeData* data, Qt::DropAction, int, int column,
                                          const QModelIndex& parent) const {
  const int target = parent.isValid() ? parent.column() : column;
  return data->hasFormat(QString::fromLatin1(kMimeType)) && target >= 0 &&
         target < static_cast<int>(devices_.size());
}

bool PlacementBoardModel::dropMimeData(const QMimeData* data, Qt::DropAction action, int row,
                                       int column, const QModelIndex& parent) {
  if (!canDropMimeData(data, action, row, column, parent)) return false;
  const Device to = devices_[static_cast<size_t>(parent.isValid() ? parent.column() : column)];
  std::vector<int> dense, experts;
  for (const QString& line :
       QString::fromUtf8(data->data(QString::fromLatin1(kMimeType))).split(QLatin1Char('\n'))) {
    const QStringList fields = line.split(QLatin1Char(' '));
    if (fields.size() != 2) continue;
    (fields[1] == QLatin1String("dense") ? dense : experts).push_back(fields[0].toInt());
  }
  // Experts dropped on a GPU column: the layer's slider says how many a GPU holds, not a drag.
  if (!to.isCpu()) experts.clear();
  if (dense.empty() && experts.empty()) return false;
  if (dense.empty()) return move(experts, Part::Experts, to);
  if (experts.empty()) return move(dense, Part::Dense, to);
  undo_.beginMacro(tr("Move to %1").arg(QString::fromStdString(to.str())));
  const bool ok = move(dense, Part::Dense, to) && move(experts, Part::Experts, to);
  undo_.endMacro();
  return ok;
}

}  // namespace tandem::ui
