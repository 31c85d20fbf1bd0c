#pragma once
// The training page's line on sequence length (issue 29): the longest cutoff_len that fits this
// machine with the run's settings, as the memory planner predicts it (placement/sequence_fit.h),
// with the predicted GPU and host peaks at the run's own cutoff_len; the tooltip lists what
// lengthens it (offload_checkpoints, moe_token_chunk, a smaller batch).

#include <QLabel>
#include <memory>

namespace tandem::placement {
struct SequenceFit;
}

namespace tandem::ui {

class SequenceFitLabel : public QLabel {
  Q_OBJECT

 public:
  explicit SequenceFitLabel(QWidget* parent = nullptr);

  // The planner's verdict for the run starting (null: none, e.g. a config it cannot judge).
  void setFit(std::shared_ptr<const placement::SequenceFit> fit);
};

}  // namespace tandem::ui
