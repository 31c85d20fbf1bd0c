// `tandem chat --model DIR [--adapter [NAME=]DIR]...`: a multi-turn chat in the terminal with the
// model's chat template, answers streamed as they are generated. Reads one message per stdin
// line (so it also works through a pipe); commands: /base, /adapter [NAME], /reset, /exit.
// Ctrl-C stops the current answer, not the program.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app/cli/commands.h"
#include "app/cli/model_options.h"
#include "engine/core/error.h"
#include "engine/core/platform/interrupt.h"
#include "engine/core/platform/terminal.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/infer/generator.h"
#include "engine/model/model_report.h"

namespace tandem::cli {

namespace {

struct ChatOptions {
  std::string model;
  std::vector<std::string> adapters;  // [NAME=]DIR
  infer::GeneratorOptions load;
  std::string system;
  infer::GenerationSettings settings;
  bool greedy = false;
  bool merge = false;
  int threads = 0;
  uint64_t seed = 0;
  bool has_seed = false;
};

std::atomic<bool> g_interrupted{false};

void onChatInterrupt() { g_interrupted.store(true); }

// Ctrl-C while an answer streams: the answer stops at the next token, the chat goes on.
class InterruptToStop {
 public:
  InterruptToStop() {
    g_interrupted.store(false);
    interrupt_.emplace(onChatInterrupt, platform::InterruptKinds::CtrlC);
    watcher_ = std::jthread([this](std::stop_token done) {
      while (!done.stop_requested()) {
        if (g_interrupted.load()) source_.request_stop();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  ~InterruptToStop() {
    watcher_.request_stop();
    watcher_.join();
    interrupt_.reset();
  }
  std::stop_token token() const { return source_.get_token(); }

 private:
  std::stop_source source_;
  std::jthread watcher_;
  std::optional<platform::ScopedInterruptHandler> interrupt_;
};

// "NAME=DIR" or "DIR" (named after the dir, or "adapter" for the first one when that is empty).
std::pair<std::string, std::string> adapterSpec(const std::string& spec, size_t index) {
  const size_t eq = spec.find('=');
  if (eq != std::string::npos && eq > 0) return {spec.substr(0, eq), spec.substr(eq + 1)};
  return {index == 0 ? "adapter" : "adapter" + std::to_string(index + 1), spec};
}

void status(const std::string& text) { std::fprintf(stderr, "[%s]\n", text.c_str()); }

void runChat(ChatOptions o) {
  gpu::setTorchThreads(o.threads > 0
                           ? o.threads
                           : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  if (o.greedy || o.settings.temperature == 0) o.settings.do_sample = false;
  if (o.has_seed) o.settings.seed = o.seed;
  auto generator = infer::Generator::load(o.model, o.load);
  std::vector<std::string> names;
  for (size_t i = 0; i < o.adapters.size(); ++i) {
    const auto [name, dir] = adapterSpec(o.adapters[i], i);
    generator->addAdapter(name, dir,
                          o.merge ? model::AdapterMode::Merged : model::AdapterMode::Unmerged);
    names.push_back(name);
  }
  status(model::placementSummary(generator->placement()));
  std::string active = names.empty() ? "base" : names.front();
  status("model " + generator->modelName() + ", template " + generator->templateName() +
         ", answering with " + active + (names.empty() ? "" : "; /base and /adapter switch") +
         ", /reset, /exit");
  const bool interactive = platform::stdinIsTerminal();
  std::vector<infer::ChatMessage> history;
  if (!o.system.empty()) history.push_back({"system", o.system});
  const size_t kept = history.size();
  std::string line;
  while (true) {
    if (interactive) {
      std::printf("%s> ", active.c_str());
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history.resize(kept);
      status("conversation cleared");
      continue;
    }
    if (line == "/base") {
      if (!generator->baseAvailable()) {
        status("the base model is not available: the adapter is merged into it");
        continue;
      }
      active = "base";
      status("answering with the base model");
      continue;
    }
    if (line == "/adapter" || line.starts_with("/adapter ")) {
      const std::string wanted =
          line.size() > 9 ? line.substr(9) : (names.empty() ? "" : names.front());
      if (wanted.empty() || !generator->hasAdapter(wanted)) {
        std::string known;
        for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
        status(names.empty() ? "no adapter loaded (start with --adapter DIR)"
                             : "unknown adapter; loaded: " + known);
        continue;
      }
      active = wanted;
      status("answering with adapter " + active);
      continue;
    }
    if (line.starts_with("/")) {
      status("commands: /base, /adapter [NAME], /reset, /exit");
      continue;
    }
    history.push_back({"user", line});
    infer::ChatRequest request{active, history, o.settings};
    infer::GenerationResult result;
    try {
      InterruptToStop interrupt;
      result = generator->chat(
          request,
          [](const infer::GenerationDelta& d) {
            std::fwrite(d.text.data(), 1, d.text.size(), stdout);
            std::fflush(stdout);
          },
          interrupt.token());
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      history.pop_back();
      continue;
    }
    std::printf("\n");
    std::fflush(stdout);
    if (result.finish_reason == infer::FinishReason::Cancelled) status("stopped");
    history.push_back({"assistant", result.text});
  }
}

}  // namespace

void addChatCommand(CLI::App& app) {
  auto* command =
      app.add_subcommand("chat", "Chat with a model (and its LoRA adapters) in the terminal");
  auto o = std::make_shared<ChatOptions>();
  command
      ->add_option("--model", o->model, "HF model dir (config.json, safetensors, tokenizer.json)")
      ->required();
  command->add_option("--adapter", o->adapters,
                      "[NAME=]DIR: a PEFT adapter, training output or checkpoint dir (repeatable)");
  command->add_option("--template", o->load.template_name,
                      "chat template (default: from the model type)");
  command->add_option("--system", o->system, "system prompt");
  command->add_option("--temperature", o->settings.temperature, "sampling temperature (0: greedy)")
      ->capture_default_str();
  command->add_option("--top-p", o->settings.top_p, "nucleus sampling mass")->capture_default_str();
  command->add_option("--top-k", o->settings.top_k, "keep the k most likely tokens (0: all)")
      ->capture_default_str();
  command->add_option("--repetition-penalty", o->settings.repetition_penalty, "1.0: none")
      ->capture_default_str();
  command->add_option("--max-new-tokens", o->settings.max_new_tokens, "longest answer in tokens")
      ->capture_default_str();
  auto* seed = command->add_option("--seed", o->seed, "sampling seed (default: random)");
  command->add_flag("--greedy", o->greedy, "greedy decoding instead of sampling");
  command->add_flag("--merge", o->merge,
                    "merge the (single) adapter into the weights for speed; no /base then");
  addModelOptions(*command, o->load);
  command->add_option("--threads", o->threads, "CPU threads for libtorch (default: all)");
  command->callback([o, seed] {
    o->has_seed = seed->count() > 0;
    runChat(*o);
  });
}

}  // namespace tandem::cli
