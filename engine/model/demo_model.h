#pragma once
// The built-in demo's base model: a scaled-down Qwen3-MoE with random weights and the bundled
// byte-level BPE tokenizer, made once in a work directory (no download, no GPU). Shared by
// `tandem demo` and the studio's "demo" choices, so both train the very same model.

#include <filesystem>

namespace tandem::model {

struct DemoModel {
  std::filesystem::path dir;  // holds config.json, model.safetensors, tokenizer files
  bool created = false;       // made by this call (false: it was already there)
};

// cacheDir()/demo (engine/core/paths.h): $TANDEM_HOME/cache/demo, else
// $XDG_CACHE_HOME/tandem/demo, else ~/.cache/tandem/demo.
std::filesystem::path defaultDemoWorkdir();

// Builds `workdir`/model from `resources_dir`/demo/tokenizer*.json unless a complete one is
// there; a half-made one (killed midway) is rebuilt. A dir at `workdir`/model that the demo did
// not make (no demo marker, or other files in it) is never removed: an Error names what is in it.
// Throws tandem::Error.
DemoModel ensureDemoModel(const std::filesystem::path& workdir,
                          const std::filesystem::path& resources_dir);

}  // namespace tandem::model
