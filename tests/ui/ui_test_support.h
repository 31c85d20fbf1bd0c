#pragma once
// What every studio test needs: the bundled files and a demo model made in a temporary folder.

#include <QTemporaryDir>
#include <filesystem>

#include "engine/train/train_config.h"
#include "ui/fine_tune_wizard.h"

namespace tandem::ui::test {

// The bundled resources/presets, the demo work dir inside `tmp`, the demo model made there.
StudioPaths demoPaths(const QTemporaryDir& tmp);

// presets/training/demo_lora_sft.yaml on the demo model and data, writing to `output_dir`,
// with `overrides` ("key=value") applied as `tandem train` applies them.
train::TrainConfig demoConfig(const StudioPaths& paths, const std::filesystem::path& output_dir,
                              std::vector<std::string> overrides = {});

}  // namespace tandem::ui::test
