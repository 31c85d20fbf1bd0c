#include "ui/sequence_fit_label.h"

#include "engine/placement/sequence_fit.h"
#include "ui/machine_info.h"

namespace tandem::ui {

SequenceFitLabel::SequenceFitLabel(QWidget* parent) : QLabel(parent) {
  setAccessibleName(tr("Longest sequence that fits"));
  setWordWrap(true);
  setFit(nullptr);
}

void SequenceFitLabel::setFit(std::shared_ptr<const placement::SequenceFit> fit) {
  if (!fit) {
    setText(tr("Longest cutoff_len that fits: not planned yet"));
    setToolTip(QString());
    return;
  }
  const QString longest =
      fit->longest_cutoff_len == 0
          ? tr("none (not even %1 tokens)").arg(placement::kSequenceStep)
          : tr("%1%2 tokens").arg(fit->longest_cutoff_len).arg(fit->at_ceiling ? "+" : "");
  QString peaks = tr("host %1").arg(bytesText(fit->host_bytes));
  if (!fit->gpu_peak_device.empty()) {
    peaks = tr("GPU peak %1 on %2, %3")
                .arg(bytesText(fit->gpu_peak_bytes), QString::fromStdString(fit->gpu_peak_device),
                     peaks);
  }
  setText(tr("Longest cutoff_len that fits: %1 (this run %2: %3, planned)")
              .arg(longest)
              .arg(fit->cutoff_len)
              .arg(peaks));
  QString tip = tr("The memory planner's prediction for this machine and these settings.");
  for (const std::string& change : fit->lengthen)
    tip += QStringLiteral("\n") + tr("Longer with %1").arg(QString::fromStdString(change));
  setToolTip(tip);
}

}  // namespace tandem::ui
