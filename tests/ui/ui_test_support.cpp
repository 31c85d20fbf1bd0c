#include "tests/ui/ui_test_support.h"

#include "engine/model/demo_model.h"

namespace tandem::ui::test {

StudioPaths demoPaths(const QTemporaryDir& tmp) {
  StudioPaths paths;
  paths.resources = TANDEM_RESOURCES_DIR;
  paths.presets = TANDEM_PRESETS_DIR;
  paths.demo_workdir = std::filesystem::path(tmp.path().toStdString()) / "demo";
  model::ensureDemoModel(paths.demo_workdir, paths.resources);
  return paths;
}

train::TrainConfig demoConfig(const StudioPaths& paths, const std::filesystem::path& output_dir,
                              std::vector<std::string> overrides) {
  overrides.insert(
      overrides.begin(),
      {"model_name_or_path=" + (paths.demo_workdir / "model").string(),
       "dataset_dir=" + (paths.resources / "demo").string(), "output_dir=" + output_dir.string()});
  return train::loadTrainConfig(paths.presets / "training" / "demo_lora_sft.yaml", overrides);
}

}  // namespace tandem::ui::test
