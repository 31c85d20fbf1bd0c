// `tandem serve`: an OpenAI-compatible HTTP server for a model and its LoRA adapters
// (docs/serve.md). Ctrl-C or SIGTERM stops it cleanly: the running generation is cancelled,
// waiting requests are refused, open connections finish.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "app/cli/commands.h"
#include "app/cli/model_options.h"
#include "engine/core/error.h"
#include "engine/core/platform/environment.h"
#include "engine/core/platform/interrupt.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/model/model_report.h"
#include "engine/serve/model_chat_backend.h"
#include "engine/serve/openai_server.h"
#include "engine/serve/request_guard.h"

namespace tandem::cli {

namespace {

std::atomic<bool> g_stop_requested{false};

void onStopSignal() { g_stop_requested.store(true); }

struct ServeOptions {
  serve::ModelChatBackendOptions backend;
  serve::ServerOptions server;
  std::vector<std::string> adapters;  // NAME=DIR
  int threads = 0;
  std::filesystem::path api_key_file;
};

// The key's first line, without surrounding whitespace; a key file is small and not empty.
std::string readKeyFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read the API key file " + path.string(), "check --api-key-file");
  std::string text(4097, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > 4096)
    throw Error("the API key file " + path.string() + " is larger than 4 KiB",
                "put only the key in it, on one line");
  text = text.substr(0, text.find_first_of("\r\n"));
  const size_t begin = text.find_first_not_of(" \t");
  const size_t end = text.find_last_not_of(" \t");
  if (begin == std::string::npos)
    throw Error("the API key file " + path.string() + " holds no key",
                "write the key on its first line");
  return text.substr(begin, end - begin + 1);
}

// One source for the key: --api-key-file, else --api-key (visible to every user in `ps`), else
// the TANDEM_API_KEY environment variable; none of them: no key.
void resolveApiKey(ServeOptions& o) {
  if (!o.api_key_file.empty()) {
    if (!o.server.api_key.empty())
      throw Error("both --api-key and --api-key-file were given", "keep --api-key-file");
    o.server.api_key = readKeyFile(o.api_key_file);
  } else if (o.server.api_key.empty()) {
    o.server.api_key = platform::environmentVariable("TANDEM_API_KEY");
  }
}

std::pair<std::string, std::filesystem::path> parseAdapter(const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
    throw Error("--adapter '" + spec + "' is not NAME=DIR",
                "e.g. --adapter identity=saves/identity-lora");
  }
  return {spec.substr(0, eq), spec.substr(eq + 1)};
}

void runServe(ServeOptions o) {
  resolveApiKey(o);
  for (const std::string& spec : o.adapters) o.backend.adapters.push_back(parseAdapter(spec));
  o.backend.max_tokens_limit = o.server.max_tokens_limit;
  if (o.server.max_tokens_limit < 1) throw Error("--max-tokens-limit must be at least 1");
  if (o.server.max_body_bytes < 1024) throw Error("--max-body-bytes must be at least 1024");
  gpu::setTorchThreads(o.threads > 0
                           ? o.threads
                           : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  if (!serve::isLoopbackAddress(o.server.host) && o.server.api_key.empty()) {
    std::fprintf(stderr,
                 "warning: listening on %s without an API key: anyone who can reach this address "
                 "can use the model. Set one with --api-key-file or TANDEM_API_KEY.\n",
                 o.server.host.c_str());
  }
  serve::ModelChatBackend backend(o.backend);
  serve::OpenAiServer server(backend, o.server);
  const int port = server.bind();
  std::string models;
  for (const std::string& id : backend.modelIds()) models += (models.empty() ? "" : ", ") + id;
  std::printf("serving %s as models: %s\n%s\nlistening on http://%s:%d/v1%s\n",
              o.backend.model_dir.string().c_str(), models.c_str(),
              model::placementSummary(backend.generator().placement()).c_str(),
              o.server.host.c_str(), port, o.server.api_key.empty() ? "" : " (API key required)");
  std::fflush(stdout);

  g_stop_requested.store(false);
  std::optional<platform::ScopedInterruptHandler> interrupt;
  interrupt.emplace(onStopSignal, platform::InterruptKinds::CtrlCAndTerminate);
  std::jthread listener([&server] {
    server.serve();
    g_stop_requested.store(true);  // the listener ended on its own (its socket failed): stop too
  });
  while (!g_stop_requested.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::printf("stopping: cancelling the running generation, refusing waiting requests\n");
  std::fflush(stdout);
  server.stop();
  listener.join();
  interrupt.reset();
}

}  // namespace

void addServeCommand(CLI::App& app) {
  auto* command = app.add_subcommand(
      "serve", "Serve a model and its LoRA adapters over an OpenAI-compatible HTTP API");
  auto o = std::make_shared<ServeOptions>();
  command
      ->add_option("--model", o->backend.model_dir,
                   "base model dir (HF: config.json, *.safetensors, tokenizer.json)")
      ->required();
  command->add_option("--adapter", o->adapters,
                      "NAME=DIR: a PEFT adapter, training output or checkpoint dir, served as "
                      "model NAME (repeatable)");
  command->add_option(
      "--template", o->backend.generator.template_name,
      "chat template (LLaMA-Factory name: qwen3, llama3, ...; default: from the model type)");
  command->add_option("--host", o->server.host, "address to listen on")->capture_default_str();
  command->add_option("--port", o->server.port, "port (0: any free port)")->capture_default_str();
  command->add_option(
      "--api-key-file", o->api_key_file,
      "require 'Authorization: Bearer KEY' on /v1, KEY being this file's first line "
      "(or set TANDEM_API_KEY)");
  command->add_option("--api-key", o->server.api_key,
                      "the same with the key itself; other users of this machine can read it in "
                      "`ps`: prefer --api-key-file or TANDEM_API_KEY");
  addModelOptions(*command, o->backend.generator);
  command->add_option("--max-body-bytes", o->server.max_body_bytes, "largest request body")
      ->capture_default_str();
  command
      ->add_option("--max-tokens-limit", o->server.max_tokens_limit,
                   "largest max_tokens a request may ask for (and the default)")
      ->capture_default_str();
  command
      ->add_option("--queue", o->server.max_waiting,
                   "requests that may wait behind the running one (more: 503)")
      ->capture_default_str();
  command->add_option("--threads", o->threads, "CPU threads for the model (0: all)")
      ->capture_default_str();
  command->callback([o] { runServe(*o); });
}

}  // namespace tandem::cli
