// `tandem debug forward|grad`: run any model (and adapter) on given tokens and write what the
// parity tests and users compare against transformers + peft: logits, loss, LoRA gradients.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/cli/commands.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/causal_lm.h"
#include "engine/gpu/peft_adapter.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/gpu/weight_loader.h"

namespace tandem::cli {

namespace {

struct DebugOptions {
  std::string model, adapter, tokens, labels, out;
  std::string dtype = "fp32";
  std::string device = "cpu";
  std::string experts_backend = "auto";
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

at::Device parseDevice(const std::string& text) {
  try {
    at::Device device(text);
    if (device.is_cuda() && !at::hasCUDA()) {
      throw Error("--device " + text + ": no usable CUDA device", "use --device cpu");
    }
    return device;
  } catch (const c10::Error&) {
    throw Error("--device " + text + " is not a device", "use cpu or cuda:N");
  }
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
  gpu::ModelOptions options;
  options.dtype = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  options.device = parseDevice(o.device);
  options.experts_backend = o.experts_backend;
  options.gradient_checkpointing = o.gradient_checkpointing;
  options.loss_chunk_tokens = o.loss_chunk_tokens;

  const io::ModelConfig config = io::readModelConfig(o.model);
  std::unique_ptr<gpu::PeftAdapter> adapter;
  std::unique_ptr<gpu::LoraPlan> plan;
  if (!o.adapter.empty()) {
    adapter = std::make_unique<gpu::PeftAdapter>(gpu::readPeftAdapter(o.adapter, config));
    plan = std::make_unique<gpu::LoraPlan>(gpu::loraPlanFor(*adapter));
    plan->settings.dropout = 0;  // debug runs are deterministic
  } else if (gradients) {
    throw Error("debug grad needs --adapter: gradients are of LoRA weights",
                "give a PEFT adapter dir");
  }
  auto model = gpu::CausalLm::load(o.model, options, plan.get(), ThreadPool::global());
  if (adapter) gpu::applyPeftAdapter(*adapter, *model);

  std::map<std::string, at::Tensor> out;
  if (gradients) {
    const at::Tensor hidden = model->forwardHidden(ids, /*training=*/true);
    const at::Tensor loss = model->loss(hidden, labels);
    torch::autograd::backward({loss});
    at::NoGradGuard no_grad;
    out["loss"] = loss.detach().to(at::kCPU);
    out["logits"] = model->logits(hidden.detach()).to(at::kCPU);
    for (auto& [name, grad] : gpu::loraTensors(*model, /*gradients=*/true)) out[name] = grad;
  } else {
    at::NoGradGuard no_grad;
    const at::Tensor hidden = model->forwardHidden(ids, /*training=*/false);
    out["logits"] = model->logits(hidden).to(at::kCPU);
    if (labels.defined()) out["loss"] = model->loss(hidden, labels).to(at::kCPU);
  }
  for (auto& [name, t] : out) t = t.to(at::kFloat);
  gpu::writeTensorFile(o.out, out);
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
  command->add_option("--experts-backend", o->experts_backend, "auto, generic, avx512, avx512_bf16, amx_bf16, amx_int8 or onednn")->capture_default_str();
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
  const gpu::PeftAdapter adapter = gpu::readPeftAdapter(o.adapter, config);
  const gpu::LoraPlan plan = gpu::loraPlanFor(adapter);
  auto model = gpu::CausalLm::load(o.model, gpu::ModelOptions{}, &plan, ThreadPool::global());
  gpu::applyPeftAdapter(adapter, *model);
  gpu::writePeftAdapter(*model, adapter.settings, o.out,
                        o.format == "fused"            ? gpu::ExpertAdapterForm::Fused
                        : o.format == "fused-peft0.21" ? gpu::ExpertAdapterForm::FusedPeft021
                                                       : gpu::ExpertAdapterForm::PerExpert,
                        o.model);
}

}  // namespace

void addDebugCommand(CLI::App& app) {
  auto* debug = app.add_subcommand("debug", "Run a model on given tokens and write logits, loss, LoRA gradients");
  debug->require_subcommand(1);
  addVariant(*debug, "forward", "Write logits (and loss with --labels) to a .safetensors file", false);
  addVariant(*debug, "grad", "Also write the gradient of every LoRA weight under PEFT's names", true);
  auto* command = debug->add_subcommand("export-adapter", "Re-write a LoRA adapter with routed experts per expert or fused (PEFT)");
  auto o = std::make_shared<ExportOptions>();
  command->add_option("--model", o->model, "HF model dir the adapter belongs to")->required();
  command->add_option("--adapter", o->adapter, "PEFT LoRA adapter dir to read")->required();
  command->add_option("--out", o->out, "adapter dir to write")->required();
  command->add_option("--format", o->format, "fused (PEFT 0.18-0.20), fused-peft0.21 (PEFT >= 0.21) or per-expert")->capture_default_str();
  command->callback([o] { runExport(*o); });
}

}  // namespace tandem::cli
