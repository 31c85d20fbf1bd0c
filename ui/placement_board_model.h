#pragma once
// The placement board's model: rows are the model's parts in order (the embeddings, each decoder
// layer, the final norm with lm_head), columns the machine's devices (each GPU, then the host: one
// column per NUMA node, and "all nodes" where the experts are split over several). A cell says
// which part of its row lives on its device: the row's dense part (attention, router, shared
// experts or dense MLP, which the runtime keeps on one device), its routed experts (host memory),
// and the experts resident on its GPU. A last column holds each MoE layer's "experts on GPU"
// count.
//
// Every edit (a drag of a row's dense part or experts to another column, a count, a whole
// placement) is planned at once by the memory planner and pushed on the undo stack with the plan
// it gives: fit, bytes per device and the step-time estimate follow each edit, undo and redo. An
// edit the planner cannot evaluate (a device the runtime cannot run) is refused with the reason
// and changes nothing; one that does not fit is kept, and the plan says so. Resident expert counts
// are fixed per layer (placement::ModulePlacement::gpu_experts_fixed), so the rule file the board
// exports trains exactly what it shows.

#include <QAbstractTableModel>
#include <QUndoStack>
#include <optional>

#include "engine/placement/hardware.h"
#include "engine/placement/machine_rates.h"
#include "engine/placement/memory_planner.h"
#include "engine/placement/step_cost.h"
#include "engine/placement/step_time_estimate.h"

namespace tandem::ui {

class PlacementBoardModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  static constexpr const char* kMimeType = "application/x-tandem-board-parts";
  // Which part of a row an edit moves.
  enum class Part { Dense, Experts };

  PlacementBoardModel(placement::PlanRequest request, placement::Hardware hardware,
                      QObject* parent = nullptr);

  // The starting point: `placement` evaluated (empty: the planner's own), with every MoE layer's
  // resident count fixed at what that plan gives; clears the undo stack. Throws tandem::Error
  // when the planner cannot evaluate it.
  void reset(const placement::Placement& placement = {});

  const placement::Placement& placement() const { return plan_.placement; }
  const placement::MemoryPlan& plan() const { return plan_; }
  const std::optional<placement::StepTimeEstimate>& estimate() const { return estimate_; }
  // The cost model's step (issue 28) for the plan, from rates derived from the hardware's specs
  // (placement::presetRates) unless setRates gave measured ones; nullopt for a dense model or a
  // machine without a CPU expert rate. plannedMode(): the plan's experts mode among its modes.
  const std::optional<placement::StepPrediction>& prediction() const { return prediction_; }
  std::string plannedMode() const;
  const placement::MachineRates& rates() const { return rates_; }
  void setRates(placement::MachineRates rates);
  const placement::PlanRequest& request() const { return request_; }
  const placement::Hardware& hardware() const { return hardware_; }
  QUndoStack* undoStack() { return &undo_; }
  QString problem() const { return problem_; }  // why the last edit was refused; empty when fine

  // Rows and columns.
  int layerRow(int layer) const { return layer + 1; }
  int layerOfRow(int row) const;  // -1 for the embeddings and head rows
  const std::vector<placement::Device>& devices() const { return devices_; }
  int columnOf(placement::Device device) const;  // -1 when the board has no such column
  int gpuExpertsColumn() const { return static_cast<int>(devices_.size()); }
  placement::Device denseDevice(int row) const;
  std::optional<placement::Device> expertsDevice(int row) const;  // nullopt: no routed experts
  int64_t gpuExperts(int row) const;
  int64_t maxGpuExperts() const { return request_.model.num_experts; }
  // The rows whose routed experts may be resident: MoE layers on a GPU.
  bool canHoldGpuExperts(int row) const;

  // Edits (each one undo step; false and problem() set when refused). What the view's drag and
  // drop and its keyboard moves call.
  bool move(const std::vector<int>& rows, Part part, placement::Device to);
  bool setGpuExperts(int row, int64_t count);  // consecutive counts of one row merge into one step
  bool setAllGpuExperts(int64_t count);        // every MoE layer on a GPU
  bool setPlacement(const placement::Placement& placement, const QString& what);
  bool autoPlace();  // the planner's placement

  // QAbstractTableModel
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role) const override;
  Qt::ItemFlags flags(const QModelIndex& index) const override;
  bool setData(const QModelIndex& index, const QVariant& value, int role) override;
  QStringList mimeTypes() const override;
  QMimeData* mimeData(const QModelIndexList& indexes) const override;
  bool canDropMimeData(const QMimeData* data, Qt::DropAction action, int row, int column,
                       const QModelIndex& parent) const override;
  bool dropMimeData(const QMimeData* data, Qt::DropAction action, int row, int column,
                    const QModelIndex& parent) override;
  Qt::DropActions supportedDropActions() const override { return Qt::MoveAction; }
  Qt::DropActions supportedDragActions() const override { return Qt::MoveAction; }

  // The undo commands' way in: shows `plan` (already evaluated) as the board's state.
  void show(const placement::MemoryPlan& plan);

 signals:
  void planChanged();  // after every applied edit, undo and redo
  void editRefused();  // problem() says why

 private:
  std::optional<placement::MemoryPlan> evaluate(const placement::Placement& candidate);
  bool push(const placement::Placement& candidate, const QString& what, int merge_id = -1);
  // The part of `row` in `column`'s cell, the dense one first; nullopt for an empty cell.
  std::optional<Part> partAt(int row, int column) const;
  static void fixGpuExperts(placement::Placement& placement);

  placement::PlanRequest request_;
  placement::Hardware hardware_;
  std::vector<placement::Device> devices_;  // the columns
  placement::MemoryPlan plan_;
  std::optional<placement::StepTimeEstimate> estimate_;
  placement::MachineRates rates_;
  std::optional<placement::StepPrediction> prediction_;
  QString problem_;
  QUndoStack undo_;
};

}  // namespace tandem::ui
