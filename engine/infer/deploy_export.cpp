#include "engine/infer/deploy_export.h"

#include "engine/chat/ollama_modelfile.h"
#include "engine/chat/tokenizer_encoder.h"
#include "engine/core/error.h"
#include "engine/core/platform/process_info.h"
#include "engine/infer/generator.h"
#include "engine/io/atomic_file.h"
#include "engine/io/model_config.h"
#include "engine/io/tokenizer.h"

namespace tandem::infer {
namespace fs = std::filesystem;

namespace {

// Removes the temporary folder unless the export completed and renamed it.
class PartialDir {
 public:
  explicit PartialDir(fs::path path) : path_(std::move(path)) {}
  PartialDir(const PartialDir&) = delete;
  PartialDir& operator=(const PartialDir&) = delete;
  ~PartialDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  void release() { path_.clear(); }

 private:
  fs::path path_;
};

}  // namespace

fs::path defaultExportDir(const model::MergedExportRequest& request) {
  const std::string name = request.format == model::ExportFormat::Hf
                               ? "merged-hf"
                               : "merged-gguf-" + model::ggufQuantName(request.quant);
  return request.adapter / name;
}

std::string writeOllamaModelfile(const fs::path& modelfile, const std::string& from,
                                 const std::string& adapter, const fs::path& model,
                                 const std::string& template_name) {
  const io::ModelConfig config = io::readModelConfig(model);
  const io::Tokenizer tokenizer = io::Tokenizer::load(model);
  const std::string name =
      template_name.empty() ? guessTemplateName(config, tokenizer) : template_name;
  const chat::ChatTemplate& chat_template = chat::templateByName(name);
  const chat::TokenizerEncoder encoder(tokenizer, chat_template);
  chat::ModelfileSpec spec;
  spec.from = from;
  spec.adapter = adapter;
  spec.eos_text = tokenizer.idToToken(encoder.eosId());
  if (const auto bos = tokenizer.bosId()) spec.bos_text = tokenizer.idToToken(*bos);
  io::writeFileAtomically(modelfile, chat::ollamaModelfile(spec, chat_template));
  return name;
}

DeployExportResult exportMerged(const model::MergedExportRequest& request,
                                const std::string& template_name,
                                const model::ExportProgressFn& progress, std::stop_token stop) {
  const fs::path out = fs::absolute(request.out_dir).lexically_normal();
  std::error_code ec;
  if (fs::exists(out, ec)) {
    throw Error(out.string() + " already exists", "choose another --out, or remove it first");
  }
  fs::create_directories(out.parent_path());
  PartialDir partial(out.parent_path() / ("." + out.filename().string() + ".partial-" +
                                          std::to_string(platform::currentProcessId())));
  fs::remove_all(partial.path(), ec);
  fs::create_directories(partial.path());

  model::MergedExportRequest in_partial = request;
  in_partial.out_dir = partial.path();
  DeployExportResult result;
  result.merge = model::exportMergedWeights(in_partial, progress, std::move(stop));
  const fs::path weights_name = result.merge.weights.filename();
  if (request.format == model::ExportFormat::Gguf) {
    result.template_name =
        writeOllamaModelfile(partial.path() / "Modelfile", "./" + weights_name.string(), "",
                             request.base, template_name);
    result.modelfile = out / "Modelfile";
  }
  fs::rename(partial.path(), out);
  partial.release();
  result.out_dir = out;
  result.weights = out / weights_name;
  return result;
}

}  // namespace tandem::infer
