#include "ui/machine_check_dialog.h"

#include <QApplication>
#include <QBrush>
#include <QClipboard>
#include <QColor>
#include <QCoreApplication>
#include <QDialogButtonBox>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QSysInfo>
#include <QTableWidget>
#include <QVBoxLayout>

#include "engine/model/machine_doctor.h"

namespace tandem::ui {

namespace {

enum Column { StatusColumn, CheckColumn, FindingColumn, FixColumn, ColumnCount };

QColor statusColor(CheckStatus status) {
  switch (status) {
    case CheckStatus::Ok: return QColor(0x2e, 0x7d, 0x32);
    case CheckStatus::Warn: return QColor(0xb2, 0x6a, 0x00);
    case CheckStatus::Fail: return QColor(0xc6, 0x28, 0x28);
  }
  return {};
}

QTableWidgetItem* cell(const std::string& text) {
  auto* item = new QTableWidgetItem(QString::fromStdString(text));
  item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
  return item;
}

}  // namespace

QString diagnosticsText(const MachineReport& report) {
  QString version = QCoreApplication::applicationVersion();
  if (version.isEmpty()) version = QStringLiteral("unknown");
  return QStringLiteral("Tandem Studio %1\nOS: %2\nKernel: %3 %4 (%5)\n\n%6")
      .arg(version, QSysInfo::prettyProductName(), QSysInfo::kernelType(),
           QSysInfo::kernelVersion(), QSysInfo::currentCpuArchitecture(),
           QString::fromStdString(formatMachineReport(report)));
}

MachineReport checkMachineFor(const QString& output_dir) {
  return model::checkThisMachine(output_dir.toStdString());
}

MachineCheckDialog::MachineCheckDialog(QString output_dir, QWidget* parent)
    : QDialog(parent), output_dir_(std::move(output_dir)) {
  setWindowTitle(tr("Machine check"));
  summary_ = new QLabel(this);
  summary_->setWordWrap(true);
  table_ = new QTableWidget(0, ColumnCount, this);
  table_->setHorizontalHeaderLabels({tr("Status"), tr("Check"), tr("Finding"), tr("What to do")});
  table_->verticalHeader()->hide();
  table_->setWordWrap(true);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setSectionResizeMode(FindingColumn, QHeaderView::Stretch);
  table_->horizontalHeader()->setSectionResizeMode(FixColumn, QHeaderView::Stretch);

  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close, this);
  copy_ = buttons->addButton(tr("Copy diagnostics"), QDialogButtonBox::ActionRole);
  copy_->setToolTip(tr("Put this report, the Tandem version and the OS on the clipboard"));
  again_ = buttons->addButton(tr("Check again"), QDialogButtonBox::ActionRole);
  connect(copy_, &QPushButton::clicked, this, &MachineCheckDialog::copyDiagnostics);
  connect(again_, &QPushButton::clicked, this, &MachineCheckDialog::runChecks);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);

  auto* layout = new QVBoxLayout(this);
  layout->addWidget(summary_);
  layout->addWidget(table_, 1);
  layout->addWidget(buttons);
  resize(1000, 420);
  runChecks();
}

void MachineCheckDialog::runChecks() {
  checking_ = true;
  copy_->setEnabled(false);
  again_->setEnabled(false);
  summary_->setText(tr("Checking this machine…"));
  worker_.request([dir = output_dir_] { return checkMachineFor(dir); },
                  [this](EngineResult<MachineReport> result) {
                    checking_ = false;
                    again_->setEnabled(true);
                    if (result.ok()) {
                      showReport(*result.value);
                    } else {
                      summary_->setText(tr("The machine check failed: %1").arg(result.error));
                    }
                    emit checked();
                  });
}

void MachineCheckDialog::showReport(const MachineReport& report) {
  report_ = report;
  table_->setRowCount(static_cast<int>(report.checks.size()));
  for (int row = 0; row < table_->rowCount(); ++row) {
    const MachineCheck& check = report.checks[static_cast<size_t>(row)];
    QTableWidgetItem* status = cell(std::string(checkStatusName(check.status)));
    status->setForeground(QBrush(statusColor(check.status)));
    table_->setItem(row, StatusColumn, status);
    table_->setItem(row, CheckColumn, cell(check.title));
    table_->setItem(row, FindingColumn, cell(check.finding));
    table_->setItem(row, FixColumn, cell(check.fix));
  }
  table_->resizeRowsToContents();
  summary_->setText(
      tr("%1 failed, %2 warning(s), %3 ok. Failed checks stop a long run; warnings slow it.")
          .arg(report.count(CheckStatus::Fail))
          .arg(report.count(CheckStatus::Warn))
          .arg(report.count(CheckStatus::Ok)));
  copy_->setEnabled(true);
}

void MachineCheckDialog::copyDiagnostics() {
  if (!report_) return;
  QApplication::clipboard()->setText(diagnosticsText(*report_));
}

}  // namespace tandem::ui
