// `tandem demo`: the built-in demo, with no download and no GPU. It makes (once) a small
// Qwen3-MoE with random weights and a byte-level BPE tokenizer trained on bundled text,
// fine-tunes it with LoRA on the bundled identity dataset, and asks both the base model and the
// adapter one of the dataset's questions.

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/cli/commands.h"
#include "app/cli/train_progress.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/causal_lm.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/infer/generator.h"
#include "engine/io/atomic_file.h"
#include "engine/io/tokenizer.h"

namespace tandem::cli {

namespace {

namespace fs = std::filesystem;

fs::path sourceDir(const char* env, const char* built_in) {
  const char* value = std::getenv(env);
  return value && *value ? fs::path(value) : fs::path(built_in);
}

fs::path defaultWorkdir() {
  if (const char* home = std::getenv("TANDEM_HOME"); home && *home) return fs::path(home) / "demo";
  const char* user_home = std::getenv("HOME");
  return fs::path(user_home ? user_home : ".") / ".cache" / "tandem" / "demo";
}

// A scaled-down Qwen3-MoE: real architecture, 16 experts top-4, ~9 M parameters.
nlohmann::json demoModelConfig(int64_t vocab_size, int32_t eos_id) {
  return {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"},
          {"hidden_size", 256}, {"intermediate_size", 512}, {"moe_intermediate_size", 128},
          {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"head_dim", 64}, {"num_experts", 16}, {"num_experts_per_tok", 4},
          {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", nlohmann::json::array()},
          {"vocab_size", vocab_size}, {"max_position_embeddings", 512}, {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0}, {"tie_word_embeddings", false}, {"hidden_act", "silu"},
          {"eos_token_id", eos_id}, {"dtype", "float32"}};
}

// Builds the demo model dir once; a half-made one (killed midway) is rebuilt.
fs::path ensureDemoModel(const fs::path& workdir, const fs::path& resources) {
  const fs::path model_dir = workdir / "model";
  if (fs::exists(model_dir / "model.safetensors") && fs::exists(model_dir / "config.json")) return model_dir;
  const fs::path tmp = workdir / "model.tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(resources / "demo" / file, tmp / file, fs::copy_options::overwrite_existing);
  }
  const io::Tokenizer tokenizer = io::Tokenizer::load(tmp);
  const nlohmann::json config = demoModelConfig(tokenizer.vocabSize(), tokenizer.eosId().value_or(0));
  io::writeFileAtomically(tmp / "config.json", config.dump(2) + "\n");
  const io::ModelConfig model_config = io::readModelConfig(tmp);
  auto model = gpu::CausalLm::random(model_config, gpu::ModelOptions{}, nullptr, /*seed=*/2024,
                                     ThreadPool::global());
  model->writeRandomWeights(tmp / "model.safetensors");
  fs::remove_all(model_dir);
  fs::rename(tmp, model_dir);
  std::printf("made the demo model (random Qwen3-MoE, %lld-token BPE vocabulary) in %s\n",
              static_cast<long long>(tokenizer.vocabSize()), model_dir.string().c_str());
  return model_dir;
}

std::string answer(infer::Generator& generator, const std::string& adapter, const std::string& question) {
  infer::ChatRequest request;
  request.adapter = adapter;
  request.messages = {{"user", question}};
  request.settings.do_sample = false;
  request.settings.max_new_tokens = 48;
  return generator.chat(request).text;
}

void runDemo(const fs::path& workdir) {
  gpu::setTorchThreads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const fs::path resources = sourceDir("TANDEM_RESOURCES", TANDEM_RESOURCES_DIR);
  const fs::path presets = sourceDir("TANDEM_PRESETS", TANDEM_PRESETS_DIR);
  fs::create_directories(workdir);
  const fs::path model_dir = ensureDemoModel(workdir, resources);
  const fs::path output_dir = workdir / "output";
  const train::TrainConfig config = train::loadTrainConfig(
      presets / "training" / "demo_lora_sft.yaml",
      {"model_name_or_path=" + model_dir.string(), "dataset_dir=" + (resources / "demo").string(),
       "output_dir=" + output_dir.string(), "overwrite_output_dir=true"});
  std::printf("fine-tuning with LoRA on %s (config: %s)\n", (resources / "demo" / "identity.json").string().c_str(),
              (presets / "training" / "demo_lora_sft.yaml").string().c_str());
  store::RunStore store = store::RunStore::open(store::RunStore::defaultPath());
  const train::TrainingRunOutcome outcome = runTrainingInForeground(config, &store, /*quiet=*/false);
  if (outcome.result.outcome != train::TrainOutcome::Completed) throw Error("the demo run did not finish");
  plotIfAsked(config);

  infer::GeneratorOptions options;
  options.dtype = "fp32";
  options.template_name = config.template_name;
  auto generator = infer::Generator::load(model_dir, options);
  generator->addAdapter("tuned", output_dir);
  const std::string question = "Who are you?";
  std::printf("\nQ: %s\n", question.c_str());
  std::printf("  base model:   %s\n", answer(*generator, "base", question).c_str());
  std::printf("  with adapter: %s\n", answer(*generator, "tuned", question).c_str());
  std::printf("\nchat with it: tandem chat --model %s --adapter %s --template %s\n", model_dir.string().c_str(),
              output_dir.string().c_str(), config.template_name.c_str());
  std::printf("\nadapter (PEFT format): %s\nrun history: tandem runs\n", output_dir.string().c_str());
}

}  // namespace

void addDemoCommand(CLI::App& app) {
  auto* command = app.add_subcommand("demo", "Make a small MoE model, fine-tune it on the bundled identity set, ask it");
  auto workdir = std::make_shared<std::string>(defaultWorkdir().string());
  command->add_option("--workdir", *workdir, "where the demo model and its adapter go")->capture_default_str();
  command->callback([workdir] { runDemo(*workdir); });
}

}  // namespace tandem::cli
