#pragma once
// `tandem export` and the studio's Export dialog: a LoRA adapter made deployable
// (docs/export.md). The merged export (model/merged_export.h) goes into a temporary folder
// beside the target that is renamed into place only when complete, so a failed or cancelled
// export leaves nothing behind; a GGUF export gets an Ollama Modelfile beside it. The LoRA-only
// export (a llama.cpp LoRA GGUF) gets a Modelfile with an ADAPTER line.

#include <filesystem>
#include <stop_token>
#include <string>

#include "engine/model/merged_export.h"

namespace tandem::infer {

struct DeployExportResult {
  std::filesystem::path out_dir;
  std::filesystem::path weights;    // the .gguf or the first .safetensors
  std::filesystem::path modelfile;  // empty for --format hf
  std::string template_name;        // the chat template the Modelfile was written from
  model::MergedExportResult merge;
};

// The folder an export goes to when none is given: ADAPTER/merged-hf or ADAPTER/merged-gguf-QUANT.
std::filesystem::path defaultExportDir(const model::MergedExportRequest& request);

// request.out_dir must not exist yet (Error otherwise: Tandem never overwrites a folder).
// template_name: the chat template for the Modelfile; empty: the model family's usual one.
DeployExportResult exportMerged(const model::MergedExportRequest& request,
                                const std::string& template_name,
                                const model::ExportProgressFn& progress, std::stop_token stop);

// Writes `modelfile` (atomically) for `from` (a GGUF) with `adapter` (a LoRA GGUF, may be empty),
// its TEMPLATE and stops from the model at `model` (its tokenizer and family). Returns the
// template name used.
std::string writeOllamaModelfile(const std::filesystem::path& modelfile, const std::string& from,
                                 const std::string& adapter, const std::filesystem::path& model,
                                 const std::string& template_name);

}  // namespace tandem::infer
