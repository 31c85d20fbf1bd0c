#include "ui/studio_settings.h"

#include <QDir>
#include <QSettings>

#include "engine/model/demo_model.h"
#include "engine/store/run_store.h"

namespace tandem::ui {

StudioSettings StudioSettings::load() {
  QSettings s;
  StudioSettings out;
  out.run_store_path = s.value(QStringLiteral("paths/run_store"),
                               QString::fromStdString(store::RunStore::defaultPath().string()))
                           .toString();
  out.output_parent = s.value(QStringLiteral("paths/output_parent"),
                              QDir::home().filePath(QStringLiteral("tandem-runs")))
                          .toString();
  out.demo_workdir = s.value(QStringLiteral("paths/demo_workdir"),
                             QString::fromStdString(model::defaultDemoWorkdir().string()))
                         .toString();
  out.log_scale_loss = s.value(QStringLiteral("charts/log_scale_loss"), false).toBool();
  out.chat_max_new_tokens = s.value(QStringLiteral("chat/max_new_tokens"), 64).toInt();
  out.theme = themeChoiceFromKey(s.value(QStringLiteral("appearance/theme")).toString());
  out.notify_run_end = s.value(QStringLiteral("notifications/run_end"), true).toBool();
  out.prefill_last_run = s.value(QStringLiteral("wizard/prefill_last_run"), true).toBool();
  return out;
}

void StudioSettings::save() const {
  QSettings s;
  s.setValue(QStringLiteral("paths/run_store"), run_store_path);
  s.setValue(QStringLiteral("paths/output_parent"), output_parent);
  s.setValue(QStringLiteral("paths/demo_workdir"), demo_workdir);
  s.setValue(QStringLiteral("charts/log_scale_loss"), log_scale_loss);
  s.setValue(QStringLiteral("chat/max_new_tokens"), chat_max_new_tokens);
  s.setValue(QStringLiteral("appearance/theme"), themeChoiceKey(theme));
  s.setValue(QStringLiteral("notifications/run_end"), notify_run_end);
  s.setValue(QStringLiteral("wizard/prefill_last_run"), prefill_last_run);
}

}  // namespace tandem::ui
