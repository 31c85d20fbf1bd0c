#include "ui/settings_dialog.h"

#include <QCheckBox>
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
  auto* form = new QFormLayout;
  form->addRow(tr("&Run store:"),
               pathField(store_, PathKind::SaveFile, tr("Run store"), tr("SQLite (*.db)")));
  form->addRow(tr("&Output folder:"), pathField(output_, PathKind::Folder, tr("Output folder")));
  form->addRow(tr("&Demo folder:"), pathField(demo_, PathKind::Folder, tr("Demo folder")));
  form->addRow(tr("Chat &max tokens:"), max_tokens_);
  form->addRow(QString(), log_scale_);
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
  return s;
}

}  // namespace tandem::ui
