// `tandem demo`: the built-in demo, with no download and no GPU. It makes (once) a small
// Qwen3-MoE with random weights and a byte-level BPE tokenizer trained on bundled text,
// fine-tunes it with LoRA on the bundled identity dataset, and asks both the base model and the
// adapter one of the dataset's questions.

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "app/cli/commands.h"
#include "app/cli/train_progress.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/causal_lm.h"
#include "engine/gpu/peft_adapter.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/infer/generate.h"
#include "engine/io/tokenizer.h"
#include "engine/train/chat_template.h"
#include "engine/train/demo_model.h"
#include "engine/train/supervised_encoder.h"
#include "engine/train/tokenizer_encoder.h"

namespace tandem::cli {

namespace {

namespace fs = std::filesystem;

fs::path sourceDir(const char* env, const char* built_in) {
  const char* value = std::getenv(env);
  return value && *value ? fs::path(value) : fs::path(built_in);
}

std::string answer(const gpu::CausalLm& model, const io::Tokenizer& tokenizer,
                   const train::ChatTemplate& chat_template, const std::string& question) {
  train::Conversation conversation;
  conversation.messages.push_back({train::Role::User, question});
  const train::TokenizerEncoder encoder(tokenizer, chat_template);
  const int32_t eos = encoder.eosId();
  const std::vector<int32_t> prompt =
      train::encodePieces(chat_template.renderForGeneration(conversation), encoder);
  infer::GreedySettings settings;
  settings.max_new_tokens = 48;
  settings.stop_ids = {eos};
  std::vector<int32_t> ids = infer::generateGreedy(model, prompt, settings);
  if (!ids.empty() && ids.back() == eos) ids.pop_back();
  return tokenizer.decode(ids, /*skip_special_tokens=*/true);
}

void runDemo(const fs::path& workdir) {
  gpu::setTorchThreads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const fs::path resources = sourceDir("TANDEM_RESOURCES", TANDEM_RESOURCES_DIR);
  const fs::path presets = sourceDir("TANDEM_PRESETS", TANDEM_PRESETS_DIR);
  fs::create_directories(workdir);
  const train::DemoModel demo = train::ensureDemoModel(workdir, resources);
  const fs::path& model_dir = demo.dir;
  if (demo.created) std::printf("made the demo model (random Qwen3-MoE) in %s\n", model_dir.string().c_str());
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

  const io::Tokenizer tokenizer = io::Tokenizer::load(model_dir);
  const train::ChatTemplate& chat_template = train::templateByName(config.template_name);
  const io::ModelConfig model_config = io::readModelConfig(model_dir);
  auto base = gpu::CausalLm::load(model_dir, gpu::ModelOptions{}, nullptr, ThreadPool::global());
  const gpu::PeftAdapter adapter = gpu::readPeftAdapter(output_dir, model_config);
  const gpu::LoraPlan plan = gpu::loraPlanFor(adapter);
  auto tuned = gpu::CausalLm::load(model_dir, gpu::ModelOptions{}, &plan, ThreadPool::global());
  gpu::applyPeftAdapter(adapter, *tuned);
  const std::string question = "Who are you?";
  std::printf("\nQ: %s\n", question.c_str());
  std::printf("  base model:   %s\n", answer(*base, tokenizer, chat_template, question).c_str());
  std::printf("  with adapter: %s\n", answer(*tuned, tokenizer, chat_template, question).c_str());
  std::printf("\nadapter (PEFT format): %s\nrun history: tandem runs\n", output_dir.string().c_str());
}

}  // namespace

void addDemoCommand(CLI::App& app) {
  auto* command = app.add_subcommand("demo", "Make a small MoE model, fine-tune it on the bundled identity set, ask it");
  auto workdir = std::make_shared<std::string>(train::defaultDemoWorkdir().string());
  command->add_option("--workdir", *workdir, "where the demo model and its adapter go")->capture_default_str();
  command->callback([workdir] { runDemo(*workdir); });
}

}  // namespace tandem::cli
