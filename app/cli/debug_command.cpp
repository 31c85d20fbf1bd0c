// `tandem debug forward|grad|generate`: run any model (and adapter) on given tokens and write
// what the parity tests and users compare against transformers + peft: logits, loss, LoRA
// gradients, generated token ids.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/cli/commands.h"
#include "app/cli/experts_options.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/model/causal_lm.h"
#include "engine/model/peft_adapter.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/model/weight_loader.h"
#include "engine/infer/adapter_set.h"
#include "engine/infer/generate.h"

namespace tandem::cli {

namespace {

struct DebugOptions {
  std::string model, adapter, tokens, labels, out;
  std::string dtype = "fp32";
  std::string device = "cpu";
  std::string experts_backend = "auto";
  std::string layer_devices, head_device;
  std::string experts = "cpu";
  std::string experts_format = "auto";
  std::string experts_wt_policy = "persistent";
  int64_t gpu_experts = 0;
  bool gradient_checkpointing = false;
  int64_t loss_chunk_tokens = 1024;
};

// A JSON array of arrays of ints; rows may differ in length (right padding).
std::vector<std::vector<int64_t>> readRows(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw Error(std::string("cannot read the ") + what + " file " + path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + " is not valid JSON (" + e.what() + ")",
                std::string("write the ") + what + " as a JSON array of arrays of integers");
  }
  if (!j.is_array() || j.empty()) {
    throw Error(path + ": expected a non-empty JSON array of arrays of integers");
  }
  std::vector<std::vector<int64_t>> rows;
  for (size_t r = 0; r < j.size(); ++r) {
    if (!j[r].is_array() || j[r].empty()) {
      throw Error(path + ": row " + std::to_string(r) + " is not a non-empty array");
    }
    std::vector<int64_t> row;
    for (const auto& v : j[r]) {
      if (!v.is_number_integer()) throw Error(path + ": row " + std::to_string(r) + " holds a non-integer");
      row.push_back(v.get<int64_t>());
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

at::Tensor padRows(const std::vector<std::vector<int64_t>>& rows, int64_t pad) {
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.size());
  at::Tensor t = at::full({static_cast<int64_t>(rows.size()), static_cast<int64_t>(width)}, pad, at::kLong);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].begin(), rows[r].end(), t[r].data_ptr<int64_t>());
  }
  return t;
}

void runDebug(const DebugOptions& o, bool gradients) {
  if (o.dtype != "fp32" && o.dtype != "bf16") throw Error("--dtype must be fp32 or bf16");
  const auto token_rows = readRows(o.tokens, "tokens");
  const at::Tensor ids = padRows(token_rows, 0);
  at::Tensor labels;
  if (!o.labels.empty()) {
    const auto label_rows = readRows(o.labels, "labels");
    bool same_shape = label_rows.size() == token_rows.size();
    for (size_t r = 0; same_shape && r < label_rows.size(); ++r) {
      same_shape = label_rows[r].size() == token_rows[r].size();
    }
    if (!same_shape) throw Error(o.labels + ": labels must have exactly the shape of the tokens");
    labels = padRows(label_rows, -100);
  } else if (gradients) {
    throw Error("debug grad needs --labels", "give a labels file shaped like the tokens");
  }

  gpu::setTorchThreads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  model::ModelOptions options;
  options.dtype = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  const io::ModelConfig config = io::readModelConfig(o.model);
  options.device = model::parseDevice(o.device);
  if (!o.layer_devices.empty()) {
    options.layer_devices = model::parseLayerDevices(o.layer_devices, config.num_hidden_layers, options.device);
  }
  if (!o.head_device.empty()) options.head_device = model::parseDevice(o.head_device);
  options.experts = model::parseExpertsMode(o.experts);
  options.experts_backend = o.experts_backend;
  options.experts_format = o.experts_format;
  options.experts_wt_policy = experts::parseWtPolicy(o.experts_wt_policy);
  if (o.gpu_experts > 0) options.gpu_experts.assign(static_cast<size_t>(config.num_hidden_layers), o.gpu_experts);
  options.gradient_checkpointing = o.gradient_checkpointing;
  options.loss_chunk_tokens = o.loss_chunk_tokens;

  std::unique_ptr<model::PeftAdapter> adapter;
  std::unique_ptr<model::LoraPlan> plan;
  if (!o.adapter.empty()) {
    adapter = std::make_unique<model::PeftAdapter>(model::readPeftAdapter(o.adapter, config));
    plan = std::make_unique<model::LoraPlan>(model::loraPlanFor(*adapter));
    plan->settings.dropout = 0;  // debug runs are deterministic
  } else if (gradients) {
    throw Error("debug grad needs --adapter: gradients are of LoRA weights",
                "give a PEFT adapter dir");
  }
  auto model = model::CausalLm::load(o.model, options, plan.get(), ThreadPool::global());
  if (adapter) model::applyPeftAdapter(*adapter, *model);

  std::map<std::string, at::Tensor> out;
  if (gradients) {
    const at::Tensor hidden = model->forwardHidden(ids, /*training=*/true);
    const at::Tensor loss = model->loss(hidden, labels);
    torch::autograd::backward({loss});
    at::NoGradGuard no_grad;
    out["loss"] = loss.detach().to(at::kCPU);
    out["logits"] = model->logits(hidden.detach()).to(at::kCPU);
    for (auto& [name, grad] : model::loraTensors(*model, /*gradients=*/true)) out[name] = grad;
  } else {
    at::NoGradGuard no_grad;
    const at::Tensor hidden = model->forwardHidden(ids, /*training=*/false);
    out["logits"] = model->logits(hidden).to(at::kCPU);
    if (labels.defined()) out["loss"] = model->loss(hidden, labels).to(at::kCPU);
  }
  for (auto& [name, t] : out) t = t.to(at::kFloat);
  model::writeTensorFile(o.out, out);
}

void addVariant(CLI::App& debug, const char* name, const char* help, bool gradients) {
  auto* command = debug.add_subcommand(name, help);
  auto o = std::make_shared<DebugOptions>();
  command->add_option("--model", o->model, "HF model dir (config.json + safetensors)")->required();
  command->add_option("--adapter", o->adapter, "PEFT LoRA adapter dir");
  command->add_option("--tokens", o->tokens, "JSON array of token-id rows (ragged = right padding)")->required();
  command->add_option("--labels", o->labels, "JSON labels shaped like the tokens, -100 ignored");
  command->add_option("--out", o->out, "output .safetensors")->required();
  command->add_option("--dtype", o->dtype, "fp32 or bf16")->capture_default_str();
  command->add_option("--device", o->device, "cpu or cuda:N for the dense parts")->capture_default_str();
  command->add_option("--layer-devices", o->layer_devices,
                      "decoder layers per device, e.g. cuda:0:0-13,cuda:1:14-27 (others: --device)");
  command->add_option("--head-device", o->head_device, "final norm and lm_head (default: the last layer's)");
  command->add_option("--experts", o->experts, "cpu (CPU expert engine) or gpu-offload (weights streamed to the layer's device)")
      ->capture_default_str();
  addExpertsOptions(*command, o->experts_backend, o->experts_format, o->gpu_experts);
  command->add_option("--experts-wt-policy", o->experts_wt_policy, "backward W^T: persistent, on_demand or background")
      ->check(CLI::IsMember({"persistent", "on_demand", "background"}))
      ->capture_default_str();
  command->add_flag("--gradient-checkpointing", o->gradient_checkpointing, "recompute each layer in backward");
  command->add_option("--loss-chunk-tokens", o->loss_chunk_tokens, "logit rows per loss chunk")->capture_default_str();
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
  const io::ModelConfig config = io::readModelConfig(o.model);
  const model::PeftAdapter adapter = model::readPeftAdapter(o.adapter, config);
  const model::LoraPlan plan = model::loraPlanFor(adapter);
  auto model = model::CausalLm::load(o.model, model::ModelOptions{}, &plan, ThreadPool::global());
  model::applyPeftAdapter(adapter, *model);
  model::writePeftAdapter(*model, adapter.settings, o.out,
                        o.format == "fused"            ? model::ExpertAdapterForm::Fused
                        : o.format == "fused-peft0.21" ? model::ExpertAdapterForm::FusedPeft021
                                                       : model::ExpertAdapterForm::PerExpert,
                        o.model);
}

struct GenerateOptions {
  std::string model, adapter, tokens;
  std::string dtype = "fp32";
  std::string device = "cpu";
  std::string experts_backend = "auto";
  std::string experts_format = "auto";
  int64_t max_new_tokens = 64;
  int64_t gpu_experts = 0;
  bool merge = false;
  bool sample = false;
  uint64_t seed = 0;
  int threads = 0;
};

// Greedy (or seeded sampled) continuations of each prompt row, printed as JSON:
// {"base": [[ids]...], "adapter": [[ids]...], "timing": [{prefill_s, decode_s, ...}...]}. With
// --adapter, base and adapter answers alternate per prompt, so switching adapters on one loaded
// base is exercised both ways.
void runGenerate(const GenerateOptions& o) {
  if (o.dtype != "fp32" && o.dtype != "bf16") throw Error("--dtype must be fp32 or bf16");
  if (o.merge && o.adapter.empty()) throw Error("--merge needs --adapter");
  const auto rows = readRows(o.tokens, "tokens");
  gpu::setTorchThreads(o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  model::ModelOptions options;
  options.dtype = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  options.device = model::parseDevice(o.device);
  options.experts_backend = o.experts_backend;
  options.experts_format = o.experts_format;
  if (o.gpu_experts > 0) {
    options.gpu_experts.assign(static_cast<size_t>(io::readModelConfig(o.model).num_hidden_layers), o.gpu_experts);
  }
  auto model = model::CausalLm::load(o.model, options, nullptr, ThreadPool::global());
  infer::AdapterSet adapters(*model);
  if (!o.adapter.empty()) {
    adapters.add("adapter", o.adapter, o.merge ? infer::AdapterMode::Merged : infer::AdapterMode::Unmerged);
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
      out["timing"].push_back({{"variant", v}, {"prompt_tokens", prompt.size()}, {"new_tokens", outcome.ids.size()},
                               {"prefill_s", outcome.prefill_seconds}, {"decode_s", outcome.decode_seconds}});
    }
  }
  std::printf("%s\n", out.dump().c_str());
}

void addGenerate(CLI::App& debug) {
  auto* command = debug.add_subcommand("generate", "Print greedy continuations of token prompts as JSON (KV-cached decode)");
  auto o = std::make_shared<GenerateOptions>();
  command->add_option("--model", o->model, "HF model dir (config.json + safetensors)")->required();
  command->add_option("--adapter", o->adapter, "PEFT adapter dir or Tandem checkpoint dir");
  command->add_option("--tokens", o->tokens, "JSON array of prompt rows (token ids)")->required();
  command->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate per prompt")->capture_default_str();
  command->add_option("--dtype", o->dtype, "fp32 or bf16")->capture_default_str();
  command->add_option("--device", o->device, "cpu or cuda:N for the dense parts")->capture_default_str();
  addExpertsOptions(*command, o->experts_backend, o->experts_format, o->gpu_experts);
  command->add_flag("--merge", o->merge, "merge the adapter into the dense weights (prints only \"adapter\")");
  command->add_flag("--sample", o->sample, "sample with LLaMA-Factory's defaults instead of greedy");
  command->add_option("--seed", o->seed, "sampling seed")->capture_default_str();
  command->add_option("--threads", o->threads, "libtorch intra-op threads (default: all)");
  command->callback([o] { runGenerate(*o); });
}

}  // namespace

void addDebugCommand(CLI::App& app) {
  auto* debug = app.add_subcommand("debug", "Run a model on given tokens and write logits, loss, LoRA gradients");
  debug->require_subcommand(1);
  addVariant(*debug, "forward", "Write logits (and loss with --labels) to a .safetensors file", false);
  addVariant(*debug, "grad", "Also write the gradient of every LoRA weight under PEFT's names", true);
  addGenerate(*debug);
  auto* command = debug->add_subcommand("export-adapter", "Re-write a LoRA adapter with routed experts per expert or fused (PEFT)");
  auto o = std::make_shared<ExportOptions>();
  command->add_option("--model", o->model, "HF model dir the adapter belongs to")->required();
  command->add_option("--adapter", o->adapter, "PEFT LoRA adapter dir to read")->required();
  command->add_option("--out", o->out, "adapter dir to write")->required();
  command->add_option("--format", o->format, "fused (PEFT 0.18-0.20), fused-peft0.21 (PEFT >= 0.21) or per-expert")->capture_default_str();
  command->callback([o] { runExport(*o); });
}

}  // namespace tandem::cli
