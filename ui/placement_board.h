#pragma once
// The placement board: the model's layers as rows, the machine's devices as columns
// (placement_board_model.h). Drag a layer's attention/dense part, or its routed experts, to
// another column (or Ctrl+Left/Right, Alt+Left/Right on the selected rows); set how many routed
// experts each MoE layer keeps on its GPU with the layer's slider, or every layer's with the
// global one. The fit badge, the memory map and the estimated tokens/s follow every edit, undo
// (Ctrl+Z) and redo; KTransformers rule files import and export as the review page uses them:
// the exported file carries the board's per-layer counts, so the run trains what it shows.
// "Module list…" opens the module-by-module editor (placement_editor.h) on the board's placement.

#include <QDialog>
#include <filesystem>
#include <vector>

#include "engine/placement/hardware.h"
#include "engine/placement/memory_planner.h"

class QLabel;
class QSlider;
class QTableView;

namespace tandem::ui {

class MemoryMapWidget;
class PlacementBoardModel;

class PlacementBoard : public QDialog {
  Q_OBJECT

 public:
  // `initial` empty: the planner's placement.
  PlacementBoard(placement::PlanRequest request, placement::Hardware hardware,
                 placement::Placement initial = {}, QWidget* parent = nullptr);

  PlacementBoardModel* model() const { return model_; }
  QTableView* view() const { return view_; }
  QSlider* globalSlider() const { return global_; }
  QSlider* layerSlider(int layer) const;  // null for a layer without routed experts
  QLabel* fitBadge() const { return fit_; }
  QLabel* speedLabel() const { return speed_; }
  const placement::Placement& placement() const;
  const placement::MemoryPlan& plan() const;
  QString problem() const;  // why the last edit was refused, or what is wrong; empty when fine

  bool importRules(const std::filesystem::path& file);
  bool exportRules(const std::filesystem::path& file);  // KT rule YAML
  // The keyboard moves: the selected rows' part to the next device column to the left (-1) or
  // right (+1); experts only among the cpu columns.
  bool moveSelected(bool experts, int step);

 private:
  void refresh();
  void showProblem(const QString& problem);
  void openModuleList();
  std::vector<int> selectedRows() const;

  PlacementBoardModel* model_;
  QTableView* view_;
  std::vector<QSlider*> layer_sliders_;  // [num layers], null without routed experts
  std::vector<QLabel*> layer_counts_;
  QSlider* global_;
  QLabel* global_count_;
  QLabel* fit_;
  QLabel* speed_;
  QLabel* status_;
  MemoryMapWidget* map_;
  QString problem_;
};

}  // namespace tandem::ui
