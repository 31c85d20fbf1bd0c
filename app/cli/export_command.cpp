// `tandem export --adapter DIR --model BASE.gguf [--out FILE]`: a PEFT LoRA adapter (Tandem's or
// PEFT's) as a LoRA GGUF that llama.cpp loads on that base (`llama-cli -m BASE.gguf --lora FILE`).
// A training run on a GGUF model writes this file by itself (OUTPUT_DIR/adapter_model.gguf).

#include <cstdio>
#include <memory>
#include <string>

#include "app/cli/commands.h"
#include "engine/model/adapter_files.h"

namespace tandem::cli {
namespace {

struct ExportOptions {
  std::string adapter, model, out;
};

void runExport(const ExportOptions& o) {
  const std::filesystem::path out = o.out.empty()
                                        ? std::filesystem::path(o.adapter) / "adapter_model.gguf"
                                        : std::filesystem::path(o.out);
  model::exportLlamaCppAdapter(o.adapter, o.model, out);
  std::printf("wrote %s (llama-cli -m %s --lora %s)\n", out.c_str(), o.model.c_str(), out.c_str());
}

}  // namespace

void addExportCommand(CLI::App& app) {
  auto* command =
      app.add_subcommand("export", "Write a LoRA adapter as a GGUF file for llama.cpp (--lora)");
  auto o = std::make_shared<ExportOptions>();
  command
      ->add_option("--adapter", o->adapter,
                   "PEFT LoRA adapter dir (adapter_config.json + adapter_model.safetensors)")
      ->required();
  command->add_option("--model", o->model, "the GGUF base model the adapter is for (.gguf file)")
      ->required();
  command->add_option("--out", o->out,
                      "the .gguf file to write (default: ADAPTER/adapter_model.gguf)");
  command->callback([o] { runExport(*o); });
}

}  // namespace tandem::cli
