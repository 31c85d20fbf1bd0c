// `tandem export --adapter DIR --model BASE.gguf [--out FILE]`: a PEFT LoRA adapter (Tandem's or
// PEFT's) as a LoRA GGUF that llama.cpp loads on that base (`llama-cli -m BASE.gguf --lora FILE`).
// A training run on a GGUF model writes this file by itself (OUTPUT_DIR/adapter_model.gguf).

#include <cstdio>
#include <memory>
#include <string>

#include "app/cli/commands.h"
#include "engine/core/error.h"
#include "engine/model/adapter_files.h"

namespace tandem::cli {
namespace {

struct ExportOptions {
  std::string adapter, model, out;
  bool drop_lora_experts = false;
};

void runExport(const ExportOptions& o) {
  // A LoRA GGUF has no place for LoRA experts (docs/peft_formats.md §5): never silently a
  // different model.
  if (model::adapterHasLoraExperts(o.adapter)) {
    if (!o.drop_lora_experts) {
      throw Error(o.adapter + " has LoRA experts (lora_experts.safetensors), which a llama.cpp " +
                      "LoRA GGUF cannot hold: llama.cpp would run a different model",
                  "use the adapter with Tandem (chat, serve), or pass --drop-lora-experts to "
                  "export the LoRA part alone");
    }
    std::fprintf(stderr,
                 "warning: exporting %s WITHOUT its LoRA experts: llama.cpp with this file is a "
                 "different model from the one trained (its answers will differ from Tandem's)\n",
                 o.adapter.c_str());
  }
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
  command->add_flag("--drop-lora-experts", o->drop_lora_experts,
                    "Export an adapter trained with lora_experts without them (the GGUF is then "
                    "a different model; a warning says so)");
  command->callback([o] { runExport(*o); });
}

}  // namespace tandem::cli
