#pragma once
// Help > Machine check…: the report of `tandem doctor` (engine/model/machine_doctor.h) in a
// table, one row per check with what to do when it is not ok, and "Copy diagnostics", which puts
// that report with the Tandem version and the OS and kernel on the clipboard as plain text for a
// bug report. The checks run on an EngineWorker: the GPU probe starts CUDA, which takes seconds.

#include <QDialog>
#include <QString>
#include <optional>

#include "engine/core/machine_checks.h"
#include "ui/engine_worker.h"

class QLabel;
class QPushButton;
class QTableWidget;

namespace tandem::ui {

// The plain text "Copy diagnostics" puts on the clipboard: the Tandem version, the OS and kernel,
// then the report as `tandem doctor` prints it.
QString diagnosticsText(const MachineReport& report);

// The machine report off the GUI thread; `output_dir` empty means the run store's data directory.
MachineReport checkMachineFor(const QString& output_dir);

class MachineCheckDialog : public QDialog {
  Q_OBJECT

 public:
  // Starts the checks; `output_dir` is where the studio's runs write (its free disk is checked).
  explicit MachineCheckDialog(QString output_dir, QWidget* parent = nullptr);

  bool isChecking() const { return checking_; }
  const std::optional<MachineReport>& report() const { return report_; }
  QTableWidget* table() const { return table_; }
  QPushButton* copyButton() const { return copy_; }

 public slots:
  void runChecks();        // again: free memory and disk change
  void copyDiagnostics();  // no-op until a report arrived

 signals:
  void checked();  // a report arrived (or the checks failed: the summary line says why)

 private:
  void showReport(const MachineReport& report);

  QString output_dir_;
  std::optional<MachineReport> report_;
  bool checking_ = false;
  QLabel* summary_;
  QTableWidget* table_;
  QPushButton* copy_;
  QPushButton* again_;
  EngineWorker worker_{this};
};

}  // namespace tandem::ui
