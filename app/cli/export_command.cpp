// `tandem export`: an adapter made deployable (docs/export.md).
//   without --merge: a PEFT LoRA adapter (Tandem's or PEFT's) as a LoRA GGUF that llama.cpp loads
//     on its GGUF base (`llama-cli -m BASE.gguf --lora FILE`), and an Ollama Modelfile with an
//     ADAPTER line beside it. A training run on a GGUF model writes this file by itself.
//   --merge --format hf|gguf [--quant f16|q8_0|q4_k_m]: the base with the LoRA merged in, as a
//     Hugging Face folder or a GGUF file (+ Modelfile) in a new folder --out.

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/cli/commands.h"
#include "engine/core/error.h"
#include "engine/infer/deploy_export.h"
#include "engine/model/adapter_files.h"
#include "engine/train/output_dir.h"
#include "engine/train/train_config.h"

namespace tandem::cli {
namespace {

struct ExportOptions {
  std::string adapter, model, out, format = "gguf", quant = "f16", template_name;
  bool merge = false;
  bool drop_lora_experts = false;
};

// A LoRA GGUF or a merged model has no place for LoRA experts (docs/peft_formats.md §5): never
// silently a different model.
void checkLoraExperts(const ExportOptions& o) {
  if (!model::adapterHasLoraExperts(o.adapter)) return;
  if (!o.drop_lora_experts) {
    throw Error(
        o.adapter + " has LoRA experts (lora_experts.safetensors), which " +
            (o.merge ? std::string("a merged model") : std::string("a llama.cpp LoRA GGUF")) +
            " cannot hold: llama.cpp would run a different model",
        "use the adapter with Tandem (chat, serve), or pass --drop-lora-experts to "
        "export the LoRA part alone");
  }
  std::fprintf(stderr,
               "warning: exporting %s WITHOUT its LoRA experts: llama.cpp with this file is a "
               "different model from the one trained (its answers will differ from Tandem's)\n",
               o.adapter.c_str());
}

// The chat template the run that wrote `adapter` trained with (its tandem_run.json holds the
// config), so that the Modelfile prompts as training did; empty when that is not known.
std::string runTemplate(const std::string& adapter) {
  try {
    std::ifstream file(std::filesystem::path(adapter) / train::kRunMarkerFile);
    if (!file) return {};
    const nlohmann::json marker = nlohmann::json::parse(file);
    return train::parseTrainConfig(marker.at("config").get<std::string>(), "the run's config")
        .template_name;
  } catch (const std::exception&) {
    return {};  // not a Tandem run, or a config this version does not read: the family's default
  }
}

void runLoraExport(const ExportOptions& o) {
  const std::filesystem::path out = o.out.empty()
                                        ? std::filesystem::path(o.adapter) / "adapter_model.gguf"
                                        : std::filesystem::path(o.out);
  model::exportLlamaCppAdapter(o.adapter, o.model, out);
  std::printf("wrote %s (llama-cli -m %s --lora %s)\n", out.c_str(), o.model.c_str(), out.c_str());
  // The LoRA file is what was asked for: a Modelfile that cannot be made is a warning.
  const std::filesystem::path modelfile = out.parent_path() / "Modelfile";
  try {
    infer::writeOllamaModelfile(modelfile, std::filesystem::absolute(o.model).string(),
                                "./" + out.filename().string(), o.model, o.template_name);
    std::printf("wrote %s (ollama create NAME -f %s)\n", modelfile.c_str(), modelfile.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "warning: no Ollama Modelfile: %s\n", e.what());
  }
}

// At most four lines a second, and always the last one.
void printProgress(const model::ExportProgress& p) {
  static double last_s = -1;
  if (p.tensors_done != p.tensors_total && last_s >= 0 && p.elapsed_s - last_s < 0.25) return;
  last_s = p.elapsed_s;
  const double mb = static_cast<double>(p.bytes_written) / 1e6;
  const double mb_s = p.elapsed_s > 0 ? mb / p.elapsed_s : 0.0;
  std::fprintf(stderr, "\r[%lld/%lld tensors] %.0f MB  %.1f MB/s  %-48.48s",
               static_cast<long long>(p.tensors_done), static_cast<long long>(p.tensors_total), mb,
               mb_s, p.tensor.c_str());
  if (p.tensors_done == p.tensors_total) std::fprintf(stderr, "\n");
}

void runMergedExport(const ExportOptions& o) {
  model::MergedExportRequest request;
  request.adapter = o.adapter;
  request.base = o.model;
  request.format = model::parseExportFormat(o.format);
  request.quant = model::parseGgufQuant(o.quant);
  request.drop_lora_experts = o.drop_lora_experts;
  request.out_dir = o.out.empty() ? infer::defaultExportDir(request) : std::filesystem::path(o.out);
  const infer::DeployExportResult result =
      infer::exportMerged(request, o.template_name, printProgress, {});
  std::printf("merged %lld LoRA modules into %lld tensors: %s\n",
              static_cast<long long>(result.merge.merged_modules),
              static_cast<long long>(result.merge.tensors), result.out_dir.c_str());
  if (!result.modelfile.empty()) {
    std::printf("ollama: cd %s && ollama create NAME -f Modelfile  (template %s)\n",
                result.out_dir.c_str(), result.template_name.c_str());
  }
}

void runExport(ExportOptions o) {
  checkLoraExperts(o);
  if (o.template_name.empty()) o.template_name = runTemplate(o.adapter);
  if (o.merge)
    runMergedExport(o);
  else
    runLoraExport(o);
}

}  // namespace

void addExportCommand(CLI::App& app) {
  auto* command = app.add_subcommand(
      "export",
      "Write an adapter for deployment: a llama.cpp LoRA GGUF, or with --merge the base with the "
      "LoRA merged in (Hugging Face folder or GGUF), each with an Ollama Modelfile");
  auto o = std::make_shared<ExportOptions>();
  command
      ->add_option("--adapter", o->adapter,
                   "PEFT LoRA adapter dir (adapter_config.json + adapter_model.safetensors)")
      ->required();
  command
      ->add_option("--model", o->model,
                   "the base model: a GGUF file (LoRA export, --format gguf) or an HF folder "
                   "(--format hf)")
      ->required();
  command->add_option("--out", o->out,
                      "LoRA export: the .gguf file (default ADAPTER/adapter_model.gguf); "
                      "--merge: a new folder (default ADAPTER/merged-hf or merged-gguf-QUANT)");
  command->add_flag("--merge", o->merge, "write the base with the LoRA merged into its weights");
  command->add_option("--format", o->format, "with --merge: hf or gguf (default gguf)")
      ->check(CLI::IsMember({"hf", "gguf"}));
  command->add_option("--quant", o->quant, "with --format gguf: f16, q8_0 or q4_k_m (default f16)")
      ->check(CLI::IsMember({"f16", "q8_0", "q4_k_m"}));
  command->add_option(
      "--template", o->template_name,
      "chat template for the Modelfile (default: the run's, else the model family's)");
  command->add_flag("--drop-lora-experts", o->drop_lora_experts,
                    "Export an adapter trained with lora_experts without them (the export is then "
                    "a different model; a warning says so)");
  command->callback([o] { runExport(*o); });
}

}  // namespace tandem::cli
