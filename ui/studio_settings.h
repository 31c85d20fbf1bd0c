#pragma once
// The studio's persisted settings (QSettings, organisation "Tandem", application "Tandem Studio"):
// where runs are recorded, where new runs write, where the demo model lives, chart preferences.
// Defaults follow the CLI, so the studio and `tandem runs` see the same history.

#include <QString>

namespace tandem::ui {

struct StudioSettings {
  QString run_store_path;  // default: RunStore::defaultPath()
  QString output_parent;   // new runs go to <output_parent>/<name>; default ~/tandem-runs
  QString demo_workdir;    // default: the CLI demo's work dir
  bool log_scale_loss = false;
  int chat_max_new_tokens = 64;

  static StudioSettings load();
  void save() const;
};

}  // namespace tandem::ui
