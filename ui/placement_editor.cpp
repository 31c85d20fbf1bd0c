#include "ui/placement_editor.h"

#include <QComboBox>
#include <QDialogButtonBox>
#include <QFileDialog>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>
#include <optional>
#include <set>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/io/atomic_file.h"
#include "engine/placement/kt_rules.h"
#include "ui/error_text.h"
#include "ui/memory_map.h"
#include "ui/theme.h"

namespace tandem::ui {

namespace {

enum Column { kName, kKind, kLayer, kParams, kDevice, kBackend, kFormat, kColumns };

QString joined(const std::vector<std::string>& lines) {
  QStringList out;
  for (const std::string& l : lines) out << QString::fromStdString(l);
  return out.join(QLatin1Char('\n'));
}

}  // namespace

PlacementEditor::PlacementEditor(placement::PlanRequest request, placement::Hardware hardware,
                                 placement::Placement initial, QWidget* parent)
    : QDialog(parent), request_(std::move(request)), hardware_(std::move(hardware)) {
  setWindowTitle(tr("Placement — %1").arg(QString::fromStdString(hardware_.name)));
  table_ = new QTableWidget(0, kColumns);
  table_->setHorizontalHeaderLabels({tr("Module"), tr("Kind"), tr("Layer"), tr("Parameters"),
                                     tr("Device"), tr("Backend"), tr("Format")});
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setSectionResizeMode(kName, QHeaderView::Stretch);
  table_->verticalHeader()->setVisible(false);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::ExtendedSelection);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setAccessibleName(tr("Modules"));

  device_ = new QComboBox;
  auto addDevice = [this](placement::Device d) {
    device_->addItem(QString::fromStdString(d.str()));
  };
  for (const placement::GpuSpec& g : hardware_.gpus) addDevice(g.device());
  addDevice(placement::Device::cpu());
  if (hardware_.numa_nodes.size() > 1) {
    for (const placement::NumaNodeSpec& n : hardware_.numa_nodes)
      addDevice(placement::Device::numaNode(n.id));
  }
  backend_ = new QComboBox;
  backend_->addItem(tr("(keep)"), QString());
  for (std::string_view b : placement::kExpertBackends) {
    backend_->addItem(QString::fromLatin1(b.data(), static_cast<int>(b.size())),
                      QString::fromLatin1(b.data(), static_cast<int>(b.size())));
  }
  backend_->setToolTip(tr("The routed experts' backend; other modules have none"));
  auto* assign_button = new QPushButton(tr("&Assign to selected"));
  auto* auto_button = new QPushButton(tr("A&uto (planner)"));
  auto_button->setToolTip(
      tr("The memory planner's placement: GPUs filled by arithmetic intensity, experts in RAM"));
  auto* import_button = new QPushButton(tr("&Import rule file…"));
  auto* export_button = new QPushButton(tr("&Export rule file…"));
  auto* tools = new QHBoxLayout;
  tools->addWidget(new QLabel(tr("Device:")));
  tools->addWidget(device_);
  tools->addWidget(new QLabel(tr("Backend:")));
  tools->addWidget(backend_);
  tools->addWidget(assign_button);
  tools->addStretch(1);
  tools->addWidget(auto_button);
  tools->addWidget(import_button);
  tools->addWidget(export_button);

  map_ = new MemoryMapWidget;
  status_ = new QLabel;
  status_->setWordWrap(true);
  auto* map_box = new QGroupBox(tr("Memory plan of this placement"));
  auto* map_layout = new QVBoxLayout(map_box);
  map_layout->addWidget(map_);
  map_layout->addWidget(status_);
  map_layout->addStretch(1);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);

  auto* split = new QSplitter(Qt::Vertical);
  split->addWidget(table_);
  split->addWidget(map_box);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 1);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(tools);
  layout->addWidget(split, 1);
  layout->addWidget(buttons);
  resize(1000, 700);

  connect(assign_button, &QPushButton::clicked, this, [this] {
    assign(selectedRows(), device_->currentText(), backend_->currentData().toString());
  });
  connect(auto_button, &QPushButton::clicked, this, &PlacementEditor::autoPlace);
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

  if (initial.modules.empty() || !setPlacement(initial)) autoPlace();
}

int PlacementEditor::moduleCount() const { return table_->rowCount(); }

QString PlacementEditor::problem() const { return status_->property("problem").toString(); }

std::vector<int> PlacementEditor::selectedRows() const {
  std::set<int> rows;
  for (const QModelIndex& i : table_->selectionModel()->selectedRows()) rows.insert(i.row());
  return {rows.begin(), rows.end()};
}

bool PlacementEditor::tryPlacement(const placement::Placement& candidate) {
  QString problem;
  placement::MemoryPlan plan;
  try {
    plan = placement::evaluatePlacement(request_, hardware_, candidate);
    if (!plan.fits) problem = tr("Does not fit: %1").arg(joined(plan.problems));
  } catch (const Error& e) {
    problem = errorText(e);
  }
  if (!problem.isEmpty()) return refuse(problem, joined(plan.advice));
  placement_ = plan.placement;  // the candidate with the planner's resident expert counts
  plan_ = plan;
  status_->setProperty("problem", QString());
  status_->setStyleSheet({});
  status_->setText(tr("Fits. %1").arg(joined(plan.notes)));
  map_->setBars(plannedMemoryBars(plan_));
  refreshTable();
  return true;
}

bool PlacementEditor::refuse(const QString& problem, const QString& advice) {
  status_->setProperty("problem", problem);
  status_->setStyleSheet(problemStyleSheet(palette()));
  status_->setText(tr("Refused — %1").arg(problem) +
                   (advice.isEmpty() ? QString() : QStringLiteral("\n") + advice));
  return false;
}

bool PlacementEditor::setPlacement(const placement::Placement& placement) {
  return tryPlacement(placement);
}

bool PlacementEditor::assign(const std::vector<int>& rows, const QString& device,
                             const QString& backend) {
  std::optional<placement::Device> target;
  try {
    if (!device.isEmpty()) target = placement::Device::parse(device.toStdString());
  } catch (const Error& e) {
    return refuse(errorText(e));
  }
  placement::Placement candidate = placement_;
  for (int row : rows) {
    if (row < 0 || row >= static_cast<int>(candidate.modules.size())) continue;
    placement::ModulePlacement& m = candidate.modules[row];
    if (target) m.device = *target;
    if (m.kind == placement::ModuleKind::RoutedExperts && !backend.isEmpty()) {
      m.backend = backend.toStdString();
      m.weight_format = placement::defaultWeightFormat(m.backend, request_.model);
      m.compute_device.reset();
      if (m.backend == "gpu-offload" && !hardware_.gpus.empty())
        m.compute_device = hardware_.gpus.front().device();
    }
  }
  return tryPlacement(candidate);
}

void PlacementEditor::autoPlace() {
  try {
    const placement::MemoryPlan plan = placement::planMemory(request_, hardware_);
    placement_ = plan.placement;
    plan_ = plan;
    map_->setBars(plannedMemoryBars(plan_));
    refreshTable();
    status_->setProperty("problem", plan.fits ? QString() : joined(plan.problems));
    status_->setStyleSheet(plan.fits ? QString() : problemStyleSheet(palette()));
    status_->setText(plan.fits ? tr("The planner's placement fits. %1").arg(joined(plan.notes))
                               : tr("Even the planner's placement does not fit: %1\n%2")
                                     .arg(joined(plan.problems), joined(plan.advice)));
  } catch (const Error& e) {
    status_->setProperty("problem", errorText(e));
    status_->setText(errorText(e));
  }
}

bool PlacementEditor::importRules(const std::filesystem::path& file) {
  try {
    return tryPlacement(placement::loadPlacementFile(file, request_.model));
  } catch (const Error& e) {
    status_->setProperty("problem", errorText(e));
    status_->setText(tr("Refused — %1").arg(errorText(e)));
    return false;
  }
}

bool PlacementEditor::exportRules(const std::filesystem::path& file) {
  try {
    io::writeFileAtomically(file, placement::writeKtRules(placement_, request_.model));
    return true;
  } catch (const Error& e) {
    status_->setProperty("problem", errorText(e));
    status_->setText(errorText(e));
    return false;
  }
}

void PlacementEditor::refreshTable() {
  const QSignalBlocker block(table_);
  std::vector<int> keep = selectedRows();
  table_->setRowCount(static_cast<int>(placement_.modules.size()));
  const std::vector<placement::Device> layer_device = placement_.layerDevices();
  for (int i = 0; i < static_cast<int>(placement_.modules.size()); ++i) {
    const placement::ModulePlacement& m = placement_.modules[i];
    const QString resident =
        m.gpu_experts > 0
            ? tr(" + %1 of %2 experts on %3")
                  .arg(m.gpu_experts)
                  .arg(request_.model.num_experts)
                  .arg(QString::fromStdString(layer_device.at(static_cast<size_t>(m.layer)).str()))
            : QString();
    const QString cells[kColumns] = {
        QString::fromStdString(m.name),
        QString::fromLatin1(placement::moduleKindName(m.kind).data()),
        m.layer >= 0 ? QString::number(m.layer) : QString(),
        QString::fromStdString(
            formatCount(static_cast<uint64_t>(placement::moduleParameters(request_.model, m)))),
        QString::fromStdString(m.device.str()) +
            (m.compute_device
                 ? QStringLiteral(" → %1").arg(QString::fromStdString(m.compute_device->str()))
                 : QString()) +
            resident,
        QString::fromStdString(m.backend),
        QString::fromStdString(m.weight_format)};
    for (int c = 0; c < kColumns; ++c) table_->setItem(i, c, new QTableWidgetItem(cells[c]));
  }
  for (int row : keep) {
    table_->selectionModel()->select(table_->model()->index(row, 0),
                                     QItemSelectionModel::Select | QItemSelectionModel::Rows);
  }
}

}  // namespace tandem::ui
