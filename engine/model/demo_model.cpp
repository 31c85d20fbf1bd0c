#include "engine/model/demo_model.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/paths.h"
#include "engine/core/thread_pool.h"
#include "engine/io/atomic_file.h"
#include "engine/io/bounded_json.h"
#include "engine/io/model_config.h"
#include "engine/io/owned_dir.h"
#include "engine/io/tokenizer.h"
#include "engine/model/causal_lm.h"

namespace tandem::model {

namespace {

namespace fs = std::filesystem;

// A scaled-down Qwen3-MoE: real architecture, 16 experts top-4, ~9 M parameters.
nlohmann::json demoModelConfig(int64_t vocab_size, int32_t eos_id) {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"hidden_size", 256},
          {"intermediate_size", 512},
          {"moe_intermediate_size", 128},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 64},
          {"num_experts", 16},
          {"num_experts_per_tok", 4},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", nlohmann::json::array()},
          {"vocab_size", vocab_size},
          {"max_position_embeddings", 512},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", false},
          {"hidden_act", "silu"},
          {"eos_token_id", eos_id},
          {"dtype", "float32"}};
}

// Says the model dir (or its half-made temp dir) is the demo's, listing what the demo writes
// there: only a dir that has it, and nothing besides, is ever removed.
const char* const kDemoMarker = "tandem_demo_model.json";
const std::vector<std::string> kDemoFiles = {kDemoMarker, "config.json", "model.safetensors",
                                             "tokenizer.json", "tokenizer_config.json"};

void writeDemoMarker(const fs::path& dir) {
  io::writeFileAtomically(
      dir / kDemoMarker,
      nlohmann::json({{"tool", "tandem"}, {"kind", "demo-model"}, {"artefacts", kDemoFiles}})
              .dump(2) +
          "\n");
}

bool hasDemoMarker(const fs::path& dir) {
  try {
    const nlohmann::json j = io::readBoundedJsonFile(dir / kDemoMarker, io::kStateJsonLimits);
    return j.is_object() && j.value("tool", std::string()) == "tandem" &&
           j.value("kind", std::string()) == "demo-model";
  } catch (const Error&) {
    return false;
  }
}

// Removes `dir` when it is absent, empty, or the demo's own (marked, holding only the demo's
// files); anything else is the user's: refused, naming what is there.
void removeDemoDir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  const bool is_dir = fs::is_directory(dir, ec) && !fs::is_symlink(dir, ec);
  const std::vector<std::string> foreign =
      is_dir
          ? io::unlistedEntries(dir, hasDemoMarker(dir) ? kDemoFiles : std::vector<std::string>{})
          : std::vector<std::string>{dir.filename().string()};
  if (!foreign.empty()) {
    throw Error(dir.string() + " is not a complete demo model and holds what the demo did not " +
                    "make (" + io::nameList(foreign) + "), so the demo will not replace it",
                "give the demo another --workdir, or move " + dir.string() + " away");
  }
  fs::remove_all(dir);
}

}  // namespace

// A cache: the model is made again from the bundled tokenizer when it is missing.
fs::path defaultDemoWorkdir() { return cacheDir() / "demo"; }

DemoModel ensureDemoModel(const fs::path& workdir, const fs::path& resources_dir) {
  const fs::path model_dir = workdir / "model";
  if (fs::exists(model_dir / "model.safetensors") && fs::exists(model_dir / "config.json"))
    return {model_dir, false};
  const fs::path tmp = workdir / "model.tmp";
  removeDemoDir(model_dir);  // before anything is made: a user's dir there stops the demo
  removeDemoDir(tmp);
  fs::create_directories(tmp);
  writeDemoMarker(tmp);  // first: a kill midway leaves a dir the next run knows it may remove
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(resources_dir / "demo" / file, tmp / file, fs::copy_options::overwrite_existing);
  }
  const io::Tokenizer tokenizer = io::Tokenizer::load(tmp);
  const nlohmann::json config =
      demoModelConfig(tokenizer.vocabSize(), tokenizer.eosId().value_or(0));
  io::writeFileAtomically(tmp / "config.json", config.dump(2) + "\n");
  const io::ModelConfig model_config = io::readModelConfig(tmp);
  auto model = model::CausalLm::random(model_config, model::ModelOptions{}, nullptr, /*seed=*/2024,
                                       ThreadPool::global());
  model->writeRandomWeights(tmp / "model.safetensors");
  fs::rename(tmp, model_dir);
  return {model_dir, true};
}

}  // namespace tandem::model
