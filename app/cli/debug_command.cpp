// `tandem debug forward|grad|generate|decode`: run any model (and adapter) on given tokens and
// write what the parity tests and users compare against transformers + peft: logits, loss, LoRA
// gradients, generated token ids.

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/cli/commands.h"
#include "app/cli/model_options.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/checkpoint_offload_bytes.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/infer/generate.h"
#include "engine/io/bounded_json.h"
#include "engine/model/adapter_files.h"
#include "engine/model/adapter_set.h"
#include "engine/model/debug_tensors.h"
#include "engine/model/decode_session.h"
#include "engine/model/machine_probe.h"
#include "engine/model/model.h"
#include "engine/model/model_resolver.h"
#include "engine/train/packing.h"

namespace tandem::cli {

namespace {

// The debug commands' model defaults: everything on the CPU, no resident experts, a persistent
// Wᵀ, unless the options say otherwise.
model::ModelRequest debugRequest() {
  model::ModelRequest request;
  request.device = "cpu";
  request.gpu_experts = "0";
  request.experts_wt_policy = "persistent";
  return request;
}

struct DebugOptions {
  std::string model, adapter, tokens, labels, out;
  model::ModelRequest request = debugRequest();
  // --pack plain|neat: the token rows are samples, packed as training packs them (packing.h)
  // into rows of at most cutoff_len - 1 tokens; --packed-layout writes which samples went where.
  std::string pack, packed_layout;
  int64_t cutoff_len = 2048;
};

// The model of `dir`, placed by the memory plan for this machine and the request.
std::unique_ptr<model::Model> loadModel(const std::string& dir, const model::ModelRequest& request,
                                        const model::LoraPlan* lora) {
  const io::ModelConfig config = io::readModelConfig(dir);
  placement::PlanRequest plan_request = model::planRequestFor(request, config);
  const placement::MemoryPlan plan = model::planModel(
      plan_request, request, model::usableHardware(request, model::probeMachine()));
  return model::Model::load(dir, model::resolveModelOptions(request, config, plan), lora,
                            ThreadPool::global());
}

// A JSON array of arrays of ints; rows may differ in length (right padding).
std::vector<std::vector<int64_t>> readRows(const std::string& path, const char* what) {
  const nlohmann::json j = io::readBoundedJsonFile(path, io::kTokenIdsJsonLimits);
  if (!j.is_array() || j.empty()) {
    throw Error(path + ": expected a non-empty JSON array of arrays of integers",
                std::string("write the ") + what + " as a JSON array of arrays of integers");
  }
  std::vector<std::vector<int64_t>> rows;
  for (size_t r = 0; r < j.size(); ++r) {
    if (!j[r].is_array() || j[r].empty()) {
      throw Error(path + ": row " + std::to_string(r) + " is not a non-empty array");
    }
    std::vector<int64_t> row;
    for (const auto& v : j[r]) {
      if (!v.is_number_integer())
        throw Error(path + ": row " + std::to_string(r) + " holds a non-integer");
      row.push_back(v.get<int64_t>());
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// Rows right-padded with `pad` into one [rows, width] block.
std::vector<int64_t> padRows(const std::vector<std::vector<int64_t>>& rows, size_t width,
                             int64_t pad) {
  std::vector<int64_t> out(rows.size() * width, pad);
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy(rows[r].begin(), rows[r].end(), out.begin() + r * width);
  return out;
}

// The samples (token rows and label rows) packed as `tandem train` packs them; the layout
// {"rows": [[sample index, ...] per packed row]} goes to o.packed_layout when given.
model::TokenBatch packedBatch(const DebugOptions& o,
                              const std::vector<std::vector<int64_t>>& tokens,
                              const std::vector<std::vector<int64_t>>& labels) {
  if (o.pack != "plain" && o.pack != "neat")
    throw Error("--pack must be plain or neat, got '" + o.pack + "'");
  if (labels.empty())
    throw Error("--pack needs --labels", "give a labels file shaped like the tokens");
  std::vector<chat::EncodedSample> samples;
  for (size_t i = 0; i < tokens.size(); ++i)
    samples.push_back({std::vector<int32_t>(tokens[i].begin(), tokens[i].end()),
                       std::vector<int32_t>(labels[i].begin(), labels[i].end())});
  const train::PackedRows packed = train::packForTraining(
      samples, o.cutoff_len,
      o.pack == "neat" ? train::PackingMode::Neat : train::PackingMode::Plain);
  if (!packed.dropped.empty())
    throw Error(packed.summary(), "give samples of at most cutoff_len - 1 tokens");
  if (!o.packed_layout.empty()) {
    const nlohmann::json layout = {{"rows", packed.samples}, {"row_capacity", packed.row_capacity}};
    std::ofstream(o.packed_layout) << layout.dump() << "\n";
  }
  std::vector<int64_t> all(packed.rows.size());
  for (size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int64_t>(r);
  return train::batchOfRows(packed.rows, all, /*pad_id=*/0);
}

void runDebug(const DebugOptions& o, bool gradients) {
  const auto token_rows = readRows(o.tokens, "tokens");
  size_t width = 0;
  for (const auto& row : token_rows) width = std::max(width, row.size());
  model::TokenBatch batch;
  batch.rows = static_cast<int64_t>(token_rows.size());
  batch.width = static_cast<int64_t>(width);
  batch.input_ids = padRows(token_rows, width, 0);
  if (!o.labels.empty()) {
    const auto label_rows = readRows(o.labels, "labels");
    bool same_shape = label_rows.size() == token_rows.size();
    for (size_t r = 0; same_shape && r < label_rows.size(); ++r) {
      same_shape = label_rows[r].size() == token_rows[r].size();
    }
    if (!same_shape) throw Error(o.labels + ": labels must have exactly the shape of the tokens");
    batch.labels = padRows(label_rows, width, -100);
    if (!o.pack.empty()) batch = packedBatch(o, token_rows, label_rows);
  } else if (gradients) {
    throw Error("debug grad needs --labels", "give a labels file shaped like the tokens");
  } else if (!o.pack.empty()) {
    packedBatch(o, token_rows, {});  // the error that says what --pack needs
  }

  gpu::setTorchThreads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  model::ModelRequest request = o.request;
  request.training = gradients;
  std::unique_ptr<model::LoraPlan> plan;
  if (!o.adapter.empty()) {
    plan = std::make_unique<model::LoraPlan>(
        model::adapterLoraPlan(o.adapter, io::readModelConfig(o.model)));
    plan->settings.dropout = 0;  // debug runs are deterministic
  } else if (gradients) {
    throw Error("debug grad needs --adapter: gradients are of LoRA weights",
                "give a PEFT adapter dir");
  }
  auto model = loadModel(o.model, request, plan.get());
  if (!o.adapter.empty()) model::applyAdapter(o.adapter, *model);
  model::writeDebugTensors(*model, batch, gradients, o.out);
  // The long-context parity test checks that every layer's checkpoint went through the host.
  if (const uint64_t offloaded = gpu::checkpointBytesOffloaded(); offloaded > 0) {
    std::printf("checkpoint offload: %llu bytes through host memory\n",
                static_cast<unsigned long long>(offloaded));
  }
}

void addVariant(CLI::App& debug, const char* name, const char* help, bool gradients) {
  auto* command = debug.add_subcommand(name, help);
  auto o = std::make_shared<DebugOptions>();
  command->add_option("--model", o->model, "HF model dir (config.json + safetensors)")->required();
  command->add_option("--adapter", o->adapter, "PEFT LoRA adapter dir");
  command->add_option("--tokens", o->tokens, "JSON array of token-id rows (ragged = right padding)")
      ->required();
  command->add_option("--labels", o->labels, "JSON labels shaped like the tokens, -100 ignored");
  command->add_option("--out", o->out, "output .safetensors")->required();
  command->add_option("--pack", o->pack,
                      "plain or neat: pack the rows (samples) as training does (needs --labels)");
  command->add_option("--cutoff-len", o->cutoff_len, "with --pack: rows of cutoff_len - 1 tokens")
      ->capture_default_str();
  command->add_option("--packed-layout", o->packed_layout,
                      "with --pack: write {\"rows\": [[sample indices]...]} to this JSON file");
  addModelOptions(*command, o->request);
  addTrainingModelOptions(*command, o->request);
  command->callback([o, gradients] { runDebug(*o, gradients); });
}

struct ExportOptions {
  std::string model, adapter, out, format = "fused";
};

// Re-writes an adapter (either expert form) in the chosen form: what training will call to save.
void runExport(const ExportOptions& o) {
  if (o.format != "fused" && o.format != "fused-peft0.21" && o.format != "per-expert") {
    throw Error("--format must be fused, fused-peft0.21 or per-expert");
  }
  const model::LoraPlan plan = model::adapterLoraPlan(o.adapter, io::readModelConfig(o.model));
  auto model = model::Model::load(o.model, model::ModelOptions{}, &plan, ThreadPool::global());
  model::applyAdapter(o.adapter, *model);
  model::writeAdapter(*model, plan.settings, o.out,
                      o.format == "fused"            ? model::ExpertAdapterForm::Fused
                      : o.format == "fused-peft0.21" ? model::ExpertAdapterForm::FusedPeft021
                                                     : model::ExpertAdapterForm::PerExpert,
                      o.model);
}

struct GenerateOptions {
  std::string model, adapter, tokens;
  model::ModelRequest request = debugRequest();
  int64_t max_new_tokens = 64;
  bool merge = false;
  bool sample = false;
  uint64_t seed = 0;
  int threads = 0;
};

// The model for a debug generate / decode: torch's threads set first (0: every core), no
// training state.
std::unique_ptr<model::Model> loadForInference(const std::string& dir, model::ModelRequest request,
                                               int threads) {
  gpu::setTorchThreads(
      threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  request.training = false;
  return loadModel(dir, request, nullptr);
}

// Greedy (or seeded sampled) continuations of each prompt row, printed as JSON:
// {"base": [[ids]...], "adapter": [[ids]...], "timing": [{prefill_s, decode_s, ...}...]}. With
// --adapter, base and adapter answers alternate per prompt, so switching adapters on one loaded
// base is exercised both ways.
void runGenerate(const GenerateOptions& o) {
  if (o.merge && o.adapter.empty()) throw Error("--merge needs --adapter");
  const auto rows = readRows(o.tokens, "tokens");
  auto model = loadForInference(o.model, o.request, o.threads);
  model::AdapterSet adapters(*model);
  if (!o.adapter.empty()) {
    adapters.add("adapter", o.adapter,
                 o.merge ? model::AdapterMode::Merged : model::AdapterMode::Unmerged);
  }
  infer::GenerationSettings settings;
  settings.do_sample = o.sample;
  settings.max_new_tokens = o.max_new_tokens;
  settings.stop_on_eos = false;  // exactly max_new_tokens, as transformers without an eos
  nlohmann::json out = nlohmann::json::object();
  std::vector<std::string> variants;
  if (!o.merge) variants.push_back("base");
  if (!o.adapter.empty()) variants.push_back("adapter");
  for (const std::string& v : variants) out[v] = nlohmann::json::array();
  out["timing"] = nlohmann::json::array();
  for (const auto& row : rows) {
    const std::vector<int32_t> prompt(row.begin(), row.end());
    for (const std::string& v : variants) {
      adapters.activate(v);
      const infer::TokenOutcome outcome =
          infer::generateTokens(*model, prompt, settings, {}, o.seed);
      out[v].push_back(outcome.ids);
      out["timing"].push_back({{"variant", v},
                               {"prompt_tokens", prompt.size()},
                               {"new_tokens", outcome.ids.size()},
                               {"prefill_s", outcome.prefill_seconds},
                               {"decode_s", outcome.decode_seconds},
                               {"decode_cpu_s", outcome.decode_cpu_seconds}});
    }
  }
  std::printf("%s\n", out.dump().c_str());
}

void addGenerate(CLI::App& debug) {
  auto* command = debug.add_subcommand(
      "generate", "Print greedy continuations of token prompts as JSON (KV-cached decode)");
  auto o = std::make_shared<GenerateOptions>();
  command->add_option("--model", o->model, "HF model dir (config.json + safetensors)")->required();
  command->add_option("--adapter", o->adapter, "PEFT adapter dir or Tandem checkpoint dir");
  command->add_option("--tokens", o->tokens, "JSON array of prompt rows (token ids)")->required();
  command->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate per prompt")
      ->capture_default_str();
  addModelOptions(*command, o->request);
  command->add_flag("--merge", o->merge,
                    "merge the adapter into the dense weights (prints only \"adapter\")");
  command->add_flag("--sample", o->sample,
                    "sample with LLaMA-Factory's defaults instead of greedy");
  command->add_option("--seed", o->seed, "sampling seed")->capture_default_str();
  command->add_option("--threads", o->threads, "libtorch intra-op threads (default: all)");
  command->callback([o] { runGenerate(*o); });
}

struct DecodeOptions {
  std::string model, tokens, out, step = "auto";
  model::ModelRequest request = debugRequest();
  int64_t prompt_tokens = 0;
  int threads = 0;
};

// Teacher-forced KV-cached decode of one token row: the first --prompt-tokens as one prefill,
// then every later token fed alone, as generation feeds them. Writes the logits after the
// prefill and after each one-token feed, raw little-endian fp32 [rows - prompt + 1, vocab], so
// the decode step can be compared position by position with another implementation
// (tests/parity/test_decode_step_reference.py: llama.cpp on the same GGUF). --step libtorch
// keeps every feed on CausalLm::forwardCached, the path the fast CPU step replaces.
void runDecode(const DecodeOptions& o) {
  const auto rows = readRows(o.tokens, "tokens");
  if (rows.size() != 1) throw Error("--tokens must hold exactly one row for debug decode");
  const std::vector<int32_t> ids(rows[0].begin(), rows[0].end());
  if (o.prompt_tokens < 1 || o.prompt_tokens > static_cast<int64_t>(ids.size())) {
    throw Error("--prompt-tokens " + std::to_string(o.prompt_tokens) + " is outside [1, " +
                    std::to_string(ids.size()) + "]",
                "give the number of leading tokens to prefill in one feed");
  }
  auto model = loadForInference(o.model, o.request, o.threads);
  model::DecodeSession session(
      *model, static_cast<int64_t>(ids.size()),
      o.step == "libtorch" ? model::DecodeStepPath::Libtorch : model::DecodeStepPath::Auto);
  std::ofstream out(o.out, std::ios::binary);
  if (!out) throw Error("cannot write " + o.out, "check the directory exists and is writable");
  auto write = [&](const std::vector<float>& logits) {
    out.write(reinterpret_cast<const char*>(logits.data()),
              static_cast<std::streamsize>(logits.size() * sizeof(float)));
  };
  const auto prompt_end = ids.begin() + o.prompt_tokens;
  write(session.feed(std::span<const int32_t>(&*ids.begin(), &*ids.begin() + o.prompt_tokens)));
  for (auto it = prompt_end; it != ids.end(); ++it) write(session.feed({&*it, 1}));
  if (!out) throw Error("writing " + o.out + " failed", "check the disk has room");
}

void addDecode(CLI::App& debug) {
  auto* command = debug.add_subcommand(
      "decode", "Write teacher-forced KV-cached decode logits (raw fp32 [steps, vocab])");
  auto o = std::make_shared<DecodeOptions>();
  command->add_option("--model", o->model, "model dir or .gguf file")->required();
  command->add_option("--tokens", o->tokens, "JSON array of one token-id row")->required();
  command->add_option("--prompt-tokens", o->prompt_tokens, "leading tokens fed as one prefill")
      ->required();
  command->add_option("--out", o->out, "output file of raw fp32 logits")->required();
  command->add_option("--step", o->step, "one-token feeds: auto (the product's) or libtorch")
      ->check(CLI::IsMember({"auto", "libtorch"}))
      ->capture_default_str();
  addModelOptions(*command, o->request);
  command->add_option("--threads", o->threads, "libtorch intra-op threads (default: all)");
  command->callback([o] { runDecode(*o); });
}

}  // namespace

void addDebugCommand(CLI::App& app) {
  auto* debug = app.add_subcommand(
      "debug", "Run a model on given tokens and write logits, loss, LoRA gradients");
  debug->require_subcommand(1);
  addVariant(*debug, "forward", "Write logits (and loss with --labels) to a .safetensors file",
             false);
  addVariant(*debug, "grad", "Also write the gradient of every LoRA weight under PEFT's names",
             true);
  addGenerate(*debug);
  addDecode(*debug);
  auto* command = debug->add_subcommand(
      "export-adapter", "Re-write a LoRA adapter with routed experts per expert or fused (PEFT)");
  auto o = std::make_shared<ExportOptions>();
  command->add_option("--model", o->model, "HF model dir the adapter belongs to")->required();
  command->add_option("--adapter", o->adapter, "PEFT LoRA adapter dir to read")->required();
  command->add_option("--out", o->out, "adapter dir to write")->required();
  command
      ->add_option("--format", o->format,
                   "fused (PEFT 0.18-0.20), fused-peft0.21 (PEFT >= 0.21) or per-expert")
      ->capture_default_str();
  command->callback([o] { runExport(*o); });
}

}  // namespace tandem::cli
