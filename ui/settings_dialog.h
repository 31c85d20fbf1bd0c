#pragma once
// Settings dialog: edits StudioSettings; OK saves them (QSettings). A changed run store path
// takes effect at the next start; the palette, notifications and chart settings at once.
// "Forget recent models and datasets" clears those lists when OK is pressed.

#include <QDialog>

#include "ui/studio_settings.h"

class QCheckBox;
class QComboBox;
class QLineEdit;
class QSpinBox;

namespace tandem::ui {

class SettingsDialog : public QDialog {
  Q_OBJECT

 public:
  explicit SettingsDialog(const StudioSettings& settings, QWidget* parent = nullptr);
  StudioSettings settings() const;
  bool forgetRecent() const;

 private:
  QLineEdit* store_;
  QLineEdit* output_;
  QLineEdit* demo_;
  QCheckBox* log_scale_;
  QSpinBox* max_tokens_;
  QComboBox* theme_;
  QCheckBox* notify_;
  QCheckBox* prefill_;
  QCheckBox* forget_recent_;
};

}  // namespace tandem::ui
