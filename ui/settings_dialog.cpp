#include "ui/settings_dialog.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QFormLayout>
#include <QLineEdit>
#include <QSpinBox>
#include <QVBoxLayout>

#include "ui/path_field.h"

namespace tandem::ui {

SettingsDialog::SettingsDialog(const StudioSettings& settings, QWidget* parent) : QDialog(parent) {
  setWindowTitle(tr("Settings"));
  store_ = new QLineEdit(settings.run_store_path);
  store_->setToolTip(
      tr("The SQLite run history shared with `tandem runs` (takes effect at the next start)"));
  output_ = new QLineEdit(settings.output_parent);
  output_->setToolTip(tr("New fine-tunes write into a folder under this one"));
  demo_ = new QLineEdit(settings.demo_workdir);
  demo_->setToolTip(tr("Where the demo model is made (shared with `tandem demo`)"));
  log_scale_ = new QCheckBox(tr("Show the loss on a &log scale"));
  log_scale_->setChecked(settings.log_scale_loss);
  max_tokens_ = new QSpinBox;
  max_tokens_->setRange(1, 8192);
  max_tokens_->setValue(settings.chat_max_new_tokens);
  max_tokens_->setToolTip(tr("Default length limit of chat answers, in tokens"));
  theme_ = new QComboBox;
  theme_->setObjectName(QStringLiteral("theme"));
  theme_->addItem(tr("Follow the system"), themeChoiceKey(ThemeChoice::System));
  theme_->addItem(tr("Light"), themeChoiceKey(ThemeChoice::Light));
  theme_->addItem(tr("Dark"), themeChoiceKey(ThemeChoice::Dark));
  theme_->setCurrentIndex(theme_->findData(themeChoiceKey(settings.theme)));
  theme_->setToolTip(
      tr("The window colours; the system's follows the desktop's light/dark choice"));
  notify_ = new QCheckBox(tr("&Notify me when a run completes, stops or fails"));
  notify_->setObjectName(QStringLiteral("notify_run_end"));
  notify_->setChecked(settings.notify_run_end);
  notify_->setToolTip(
      tr("A desktop notification (the system tray or the notification service), else the "
         "taskbar entry flashes"));
  prefill_ = new QCheckBox(tr("New fine-tunes start from the las&t run's settings"));
  prefill_->setObjectName(QStringLiteral("prefill_last_run"));
  prefill_->setChecked(settings.prefill_last_run);
  prefill_->setToolTip(
      tr("At start, the wizard holds the newest run's settings with a new output folder"));
  forget_recent_ = new QCheckBox(tr("&Forget the recent models and datasets"));
  forget_recent_->setObjectName(QStringLiteral("forget_recent"));
  auto* form = new QFormLayout;
  form->addRow(tr("&Run store:"),
               pathField(store_, PathKind::SaveFile, tr("Run store"), tr("SQLite (*.db)")));
  form->addRow(tr("&Output folder:"), pathField(output_, PathKind::Folder, tr("Output folder")));
  form->addRow(tr("&Demo folder:"), pathField(demo_, PathKind::Folder, tr("Demo folder")));
  form->addRow(tr("Chat &max tokens:"), max_tokens_);
  form->addRow(QString(), log_scale_);
  form->addRow(tr("&Appearance:"), theme_);
  form->addRow(QString(), notify_);
  form->addRow(QString(), prefill_);
  form->addRow(QString(), forget_recent_);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(form);
  layout->addWidget(buttons);
  resize(640, sizeHint().height());
}

StudioSettings SettingsDialog::settings() const {
  StudioSettings s;
  s.run_store_path = store_->text().trimmed();
  s.output_parent = output_->text().trimmed();
  s.demo_workdir = demo_->text().trimmed();
  s.log_scale_loss = log_scale_->isChecked();
  s.chat_max_new_tokens = max_tokens_->value();
  s.theme = themeChoiceFromKey(theme_->currentData().toString());
  s.notify_run_end = notify_->isChecked();
  s.prefill_last_run = prefill_->isChecked();
  return s;
}

bool SettingsDialog::forgetRecent() const { return forget_recent_->isChecked(); }

}  // namespace tandem::ui
