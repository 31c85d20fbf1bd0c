// `tandem demo`: the built-in demo, with no download and no GPU. It makes (once) a small
// Qwen3-MoE with random weights and a byte-level BPE tokenizer trained on bundled text,
// fine-tunes it with LoRA on the bundled identity dataset, and asks both the base model and the
// adapter one of the dataset's questions.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "app/cli/commands.h"
#include "app/cli/train_progress.h"
#include "engine/core/error.h"
#include "engine/core/install_layout.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/infer/generator.h"
#include "engine/io/tokenizer.h"
#include "engine/model/demo_model.h"

namespace tandem::cli {

namespace {

namespace fs = std::filesystem;

std::string answer(infer::Generator& generator, const std::string& adapter,
                   const std::string& question) {
  infer::ChatRequest request;
  request.adapter = adapter;
  request.messages = {{"user", question}};
  request.settings.do_sample = false;
  request.settings.max_new_tokens = 48;
  return generator.chat(request).text;
}

void runDemo(const fs::path& workdir) {
  gpu::setTorchThreads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const fs::path resources = resourcesDir();
  const fs::path presets = presetsDir();
  fs::create_directories(workdir);
  const model::DemoModel demo = model::ensureDemoModel(workdir, resources);
  const fs::path& model_dir = demo.dir;
  if (demo.created)
    std::printf("made the demo model (random Qwen3-MoE) in %s\n", model_dir.string().c_str());
  const fs::path output_dir = workdir / "output";
  const train::TrainConfig config = train::loadTrainConfig(
      presets / "training" / "demo_lora_sft.yaml",
      {"model_name_or_path=" + model_dir.string(), "dataset_dir=" + (resources / "demo").string(),
       "output_dir=" + output_dir.string(), "overwrite_output_dir=true"});
  std::printf("fine-tuning with LoRA on %s (config: %s)\n",
              (resources / "demo" / "identity.json").string().c_str(),
              (presets / "training" / "demo_lora_sft.yaml").string().c_str());
  store::RunStore store = store::RunStore::open(store::RunStore::defaultPath());
  const train::TrainingRunOutcome outcome =
      runTrainingInForeground(config, &store, /*quiet=*/false);
  if (outcome.result.outcome != TrainOutcome::Completed) throw Error("the demo run did not finish");
  plotIfAsked(config);

  infer::GeneratorOptions options;
  options.bf16 = false;
  options.template_name = config.template_name;
  auto generator = infer::Generator::load(model_dir, options);
  generator->addAdapter("tuned", output_dir);
  const std::string question = "Who are you?";
  std::printf("\nQ: %s\n", question.c_str());
  std::printf("  base model:   %s\n", answer(*generator, "base", question).c_str());
  std::printf("  with adapter: %s\n", answer(*generator, "tuned", question).c_str());
  std::printf("\nchat with it: tandem chat --model %s --adapter %s --template %s\n",
              model_dir.string().c_str(), output_dir.string().c_str(),
              config.template_name.c_str());
  std::printf("\nadapter (PEFT format): %s\nrun history: tandem runs\n",
              output_dir.string().c_str());
}

}  // namespace

void addDemoCommand(CLI::App& app) {
  auto* command = app.add_subcommand(
      "demo", "Make a small MoE model, fine-tune it on the bundled identity set, ask it");
  auto workdir = std::make_shared<std::string>();
  // The default is worked out when the demo runs: a machine without a home directory then gets
  // the demo's error, not every command.
  command->add_option("--workdir", *workdir,
                      "where the demo model and its adapter go (default: the cache dir's demo)");
  command->callback(
      [workdir] { runDemo(workdir->empty() ? model::defaultDemoWorkdir() : fs::path(*workdir)); });
}

}  // namespace tandem::cli
