#pragma once
// Settings dialog: edits StudioSettings; OK saves them (QSettings). A changed run store path
// takes effect at the next start.

#include <QDialog>

#include "ui/studio_settings.h"

class QCheckBox;
class QLineEdit;
class QSpinBox;

namespace tandem::ui {

class SettingsDialog : public QDialog {
  Q_OBJECT

 public:
  explicit SettingsDialog(const StudioSettings& settings, QWidget* parent = nullptr);
  StudioSettings settings() const;

 private:
  QLineEdit* store_;
  QLineEdit* output_;
  QLineEdit* demo_;
  QCheckBox* log_scale_;
  QSpinBox* max_tokens_;
};

}  // namespace tandem::ui
