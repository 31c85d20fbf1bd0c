#pragma once
// The studio's persisted settings (QSettings, organisation "Tandem", application "Tandem Studio"):
// where runs are recorded, where new runs write, where the demo model lives, chart preferences.
// Defaults follow the CLI, so the studio and `tandem runs` see the same history. Preferences:
// the palette, the notification when a run ends, pre-filling the wizard with the last run.

#include <QString>

#include "ui/theme.h"

namespace tandem::ui {

struct StudioSettings {
  QString run_store_path;  // default: RunStore::defaultPath()
  QString output_parent;   // new runs go to <output_parent>/<name>; default ~/tandem-runs
  QString demo_workdir;    // default: the CLI demo's work dir
  bool log_scale_loss = false;
  int chat_max_new_tokens = 64;
  ThemeChoice theme = ThemeChoice::System;
  bool notify_run_end = true;    // a desktop notification when a run completes, stops or fails
  bool prefill_last_run = true;  // the wizard starts from the newest run's settings

  static StudioSettings load();
  void save() const;
};

}  // namespace tandem::ui
