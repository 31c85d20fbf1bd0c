#pragma once
// The placement editor: every module of the model (embeddings, each layer's attention, router,
// shared experts, routed experts or dense MLP, the final norm, lm_head) with its device, and for
// routed experts the backend and weight format. Select many rows and assign a device or backend;
// "Auto" takes the memory planner's placement; import and export KTransformers rule files. The
// memory map follows every edit, and an edit that does not fit (or that the planner cannot
// evaluate) is refused with the reason, leaving the placement as it was.

#include <QDialog>
#include <filesystem>

#include "engine/placement/hardware.h"
#include "engine/placement/memory_planner.h"

class QComboBox;
class QLabel;
class QTableWidget;

namespace tandem::ui {

class MemoryMapWidget;

class PlacementEditor : public QDialog {
  Q_OBJECT

 public:
  // `initial` empty: the planner's placement.
  PlacementEditor(placement::PlanRequest request, placement::Hardware hardware,
                  placement::Placement initial = {}, QWidget* parent = nullptr);

  const placement::Placement& placement() const { return placement_; }
  const placement::MemoryPlan& plan() const { return plan_; }
  QString problem() const;  // why the last edit was refused, or what is wrong; empty when fine
  int moduleCount() const;

  // Edits; each returns false (and keeps the placement) when the result is refused. `device` is
  // one the device box lists (cuda:N, cpu, cpu:numaK), parsed here; empty keeps each row's.
  bool assign(const std::vector<int>& rows, const QString& device, const QString& backend = {});
  bool setPlacement(const placement::Placement& placement);
  void autoPlace();
  bool importRules(const std::filesystem::path& file);
  bool exportRules(const std::filesystem::path& file);  // KT rule YAML

 private:
  bool tryPlacement(const placement::Placement& candidate);
  bool refuse(const QString& problem, const QString& advice = {});  // shows why; returns false
  void refreshTable();
  std::vector<int> selectedRows() const;

  placement::PlanRequest request_;
  placement::Hardware hardware_;
  placement::Placement placement_;
  placement::MemoryPlan plan_;
  QTableWidget* table_;
  QComboBox* device_;
  QComboBox* backend_;
  MemoryMapWidget* map_;
  QLabel* status_;
};

}  // namespace tandem::ui
