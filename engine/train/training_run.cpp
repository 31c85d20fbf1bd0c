#include "engine/train/training_run.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/core/hash.h"
#include "engine/core/log.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_types.h"
#include "engine/model/causal_lm.h"
#include "engine/model/checkpoint_dir.h"
#include "engine/model/device_map.h"
#include "engine/model/gguf_lora.h"
#include "engine/model/machine_probe.h"
#include "engine/model/peft_adapter.h"
#include "engine/io/atomic_file.h"
#include "engine/io/gguf_model.h"
#include "engine/io/tokenizer.h"
#include "engine/io/lora_target.h"
#include "engine/placement/placement.h"
#include "engine/store/run_store.h"
#include "engine/chat/chat_template.h"
#include "engine/train/dataset.h"
#include "engine/train/model_report.h"
#include "engine/chat/supervised_encoder.h"
#include "engine/train/tokenized_cache.h"
#include "engine/chat/tokenizer_encoder.h"
#include "engine/train/training_plan.h"

namespace tandem::train {

namespace {

namespace fs = std::filesystem;
const char* const kRunFile = "tandem_run.json";  // marks an output dir as ours, with its config

std::string joinTargets(const std::vector<std::string>& targets) {
  std::string out;
  for (const std::string& t : targets) out += (out.empty() ? "" : ",") + t;
  return out;
}

at::Device pickDevice(const std::string& device) {
  if (device == "auto") return at::hasCUDA() ? at::Device("cuda:0") : at::Device(at::kCPU);
  try {
    return at::Device(device == "cuda" ? "cuda:0" : device);
  } catch (const c10::Error&) {
    throw Error("device '" + device + "' is not a device", "use auto, cpu or cuda:N");
  }
}

// Every backend the expert engine has passes through (ExpertLayer says which this CPU can run);
// other names from KTransformers configs fall back to the best available one, and say so.
std::string expertsBackend(const std::string& requested) {
  for (std::string_view built : placement::kExpertBackends) {
    if (built != "gpu-offload" && requested == built) return requested;  // offload is not a CPU engine
  }
  logWarn() << "experts backend '" << requested << "' is not built yet; using the best available";
  return "auto";
}

// A run on a GGUF model also leaves its adapter as llama.cpp reads it, beside the PEFT one.
void writeLlamaCppLora(const fs::path& output_dir, const fs::path& model, const io::ModelConfig& model_config,
                       TrainListener& listener) {
  const std::unique_ptr<io::GgufModel> base = io::GgufModel::open(model);
  const fs::path file = output_dir / "adapter_model.gguf";
  model::writeGgufLora(model::readPeftAdapter(output_dir, model_config), *base, file);
  listener.onMessage("llama.cpp LoRA written to " + file.string() + " (llama-cli -m " + base->path().string() +
                     " --lora " + file.string() + ")");
}

std::vector<chat::EncodedSample> encodeAll(const TrainConfig& config, const std::vector<std::string>& names,
                                     const io::Tokenizer& tokenizer, const chat::ChatTemplate& chat_template,
                                     TrainListener& listener) {
  DatasetReport report;
  const std::vector<chat::Conversation> conversations =
      loadDatasets(config.dataset_dir, names, config.max_samples, report);
  listener.onMessage(report.summary());
  // Tokenising is the slow part; a run over the same data and settings reads it back instead.
  std::vector<fs::path> files;
  std::ostringstream settings;
  if (io::isGgufPath(config.model_name_or_path)) {
    // The tokenizer is inside the (multi-GB) file: hash its metadata as translated, not the file.
    const std::unique_ptr<io::GgufModel> gguf = io::GgufModel::open(config.model_name_or_path);
    Fnv1a64 tokenizer_hash;
    tokenizer_hash.addField(gguf->tokenizerJson());
    tokenizer_hash.addField(gguf->tokenizerConfigJson());
    settings << "gguf_tokenizer=" << tokenizer_hash.hex() << " ";
  } else {
    files.push_back(fs::path(config.model_name_or_path) / "tokenizer.json");
  }
  for (const DatasetFileReport& d : report.datasets) files.push_back(d.file);
  settings << "template=" << config.template_name << " thinking=" << config.enable_thinking
           << " cutoff=" << config.cutoff_len << " prompt=" << config.train_on_prompt
           << " history=" << config.mask_history << " max=" << config.max_samples.value_or(-1)
           << " datasets=" << joinTargets(names) << " rows=" << conversations.size();
  const fs::path cache_file = tokenizedCacheDir() / (tokenizedCacheKey(files, settings.str()) + ".bin");
  if (auto cached = readTokenizedCache(cache_file)) {
    listener.onMessage("tokenised data from the cache " + cache_file.string());
    return std::move(*cached);
  }
  const chat::TokenizerEncoder encoder(tokenizer, chat_template);
  chat::SupervisedOptions options;
  options.cutoff_len = config.cutoff_len;
  options.train_on_prompt = config.train_on_prompt;
  options.mask_history = config.mask_history;
  std::vector<chat::EncodedSample> samples;
  samples.reserve(conversations.size());
  for (const chat::Conversation& c : conversations) samples.push_back(chat::encodeSupervised(c, chat_template, encoder, options));
  try {
    writeTokenizedCache(cache_file, samples);
  } catch (const Error& e) {
    logWarn() << "could not cache the tokenised data: " << e.message();
  }
  return samples;
}

// val_size held out as LLaMA-Factory does (a fraction, rounded up, or a count), from a shuffle by
// the seed (our own, so the split is not byte-for-byte `datasets`' train_test_split).
std::vector<chat::EncodedSample> holdOut(std::vector<chat::EncodedSample>& samples, double val_size, uint64_t seed) {
  if (val_size <= 0 || samples.empty()) return {};
  const auto n = static_cast<int64_t>(samples.size());
  const int64_t n_eval = std::min<int64_t>(
      n - 1, val_size < 1 ? static_cast<int64_t>(std::ceil(val_size * static_cast<double>(n)))
                          : static_cast<int64_t>(val_size));
  if (n_eval <= 0) {
    throw Error("val_size " + std::to_string(val_size) + " leaves no training samples out of " + std::to_string(n),
                "lower val_size");
  }
  std::mt19937_64 rng(seed);
  for (int64_t i = n; i > 1; --i) std::swap(samples[i - 1], samples[rng() % i]);
  std::vector<chat::EncodedSample> eval(std::make_move_iterator(samples.end() - n_eval),
                                  std::make_move_iterator(samples.end()));
  samples.resize(n - n_eval);
  return eval;
}

// Decides what to do with an existing output dir before anything is written into it.
// Returns the checkpoint to resume from (empty: start fresh).
fs::path prepareOutputDir(const TrainConfig& config, const std::string& fingerprint) {
  const fs::path& dir = config.output_dir;
  std::error_code ec;
  const bool exists_nonempty = fs::exists(dir) && !fs::is_empty(dir, ec);
  if (!exists_nonempty) return {};
  const fs::path run_file = dir / kRunFile;
  std::string theirs;
  if (fs::exists(run_file)) {
    std::ifstream in(run_file);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_discarded()) theirs = j.value("config_fingerprint", "");
  }
  if (config.overwrite_output_dir) {
    if (!fs::exists(run_file)) {
      throw Error("output_dir " + dir.string() + " is not empty and was not written by Tandem",
                  "choose another output_dir; Tandem only overwrites its own runs");
    }
    // The marker goes last: a run killed while clearing still owns (and can clear) the dir.
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().filename() != kRunFile) fs::remove_all(entry.path());
    }
    fs::remove(run_file);
    return {};
  }
  if (theirs.empty()) {
    throw Error("Output directory " + dir.string() + " already exists and is not empty",
                "set overwrite_output_dir: true, or choose another output_dir");
  }
  if (theirs != fingerprint) {
    throw Error("output_dir " + dir.string() + " holds a run with a different configuration",
                "set overwrite_output_dir: true to start over there, or choose another output_dir");
  }
  if (config.resume == ResumeFrom::Path) return config.resume_path;
  return model::lastCheckpoint(dir);
}

class StoreListener : public TrainListener {
 public:
  StoreListener(TrainListener& inner, store::RunStore* store, int64_t run) : inner_(inner), store_(store), run_(run) {}
  void onStep(const StepEvent& e) override {
    if (store_) {
      try {
        store_->recordStep(run_, e);
      } catch (const Error& err) {
        logWarn() << "run store: " << err.message() << " (training goes on)";
      }
    }
    inner_.onStep(e);
  }
  void onCheckpoint(int64_t step, const fs::path& dir) override {
    if (store_) store_->recordEvent(run_, "checkpoint", dir.string());
    inner_.onCheckpoint(step, dir);
  }
  void onMessage(const std::string& message) override { inner_.onMessage(message); }

 private:
  TrainListener& inner_;
  store::RunStore* store_;
  int64_t run_;
};

// Says, before the run's first step is reported, how much of the routed work resident experts
// took in it (model_report.h); then passes everything through.
class FirstStepNote : public TrainListener {
 public:
  FirstStepNote(TrainListener& inner, model::CausalLm& model) : inner_(inner), model_(model) {}
  void onStep(const StepEvent& e) override {
    if (!said_) {
      said_ = true;
      const std::string share = residentExpertsShare(model_);
      if (!share.empty()) inner_.onMessage(share);
    }
    inner_.onStep(e);
  }
  void onCheckpoint(int64_t step, const fs::path& dir) override { inner_.onCheckpoint(step, dir); }
  void onMessage(const std::string& message) override { inner_.onMessage(message); }

 private:
  TrainListener& inner_;
  model::CausalLm& model_;
  bool said_ = false;
};

// The planner's verdict on this machine, before anything is loaded: a run that cannot fit is
// refused with the planner's advice instead of dying at step 0 (or hour 3).
placement::MemoryPlan refuseWhenItCannotFit(const TrainConfig& config, const io::ModelConfig& model_config) {
  placement::Hardware hardware = model::probeMachine();
  if (config.device == "cpu") hardware.gpus.clear();
  placement::MemoryPlan plan = planTraining(config, model_config, hardware);
  if (plan.fits) return plan;
  std::string problems, advice;
  for (const std::string& p : plan.problems) problems += (problems.empty() ? "" : "; ") + p;
  for (const std::string& a : plan.advice) advice += (advice.empty() ? "" : "; ") + a;
  throw Error("the memory planner says this run does not fit this machine (" + problems + ")",
              advice + (advice.empty() ? "" : "; ") + "`tandem plan CONFIG.yaml` shows the whole plan");
}

// A kt_optimize_rule file decides where the layers run (explicit layer_devices win over it).
void applyRulePlacement(const placement::RuntimePlacement& runtime, model::ModelOptions& options) {
  options.device = model::parseDevice(runtime.embed_device.str());
  options.layer_devices.clear();
  for (placement::Device device : runtime.layer_devices) options.layer_devices.push_back(model::parseDevice(device.str()));
  options.head_device = model::parseDevice(runtime.head_device.str());
  options.experts = model::parseExpertsMode(runtime.experts_mode);
  if (!runtime.experts_backend.empty()) options.experts_backend = expertsBackend(runtime.experts_backend);
  options.experts_numa_node = runtime.experts_numa_node;
  // A rule file's int8 experts (weight_format: int8) are quantised at load like experts_format: int8.
  if (options.experts_format == "auto" && runtime.experts_weight_format == "int8") options.experts_format = "int8";
}

// The planner's resident experts (gpu_experts: beside the CPU engine, or offload mode's resident
// cache) for the layers that run where it planned them: counts are per GPU memory, so a layer the
// runtime puts elsewhere gets none.
std::vector<int64_t> plannedGpuExperts(const placement::MemoryPlan& plan, const model::ModelOptions& options) {
  const auto& modules = plan.placement.modules;
  if (std::none_of(modules.begin(), modules.end(), [](const auto& m) { return m.gpu_experts > 0; })) return {};
  const placement::RuntimePlacement runtime = placement::toRuntimePlacement(plan.placement);
  std::vector<int64_t> counts(runtime.gpu_experts.size(), 0);
  for (size_t layer = 0; layer < counts.size(); ++layer) {
    if (options.layerDevice(layer).str() == runtime.layer_devices[layer].str()) counts[layer] = runtime.gpu_experts[layer];
  }
  return counts;
}

// experts_wt_policy: auto follows the memory planner (persistent when it fits, else its pool of
// two layers, which the expert engine fills in the background: the next layer's W^T is built
// while the GPU runs the layers between).
experts::WtPolicy wtPolicy(const TrainConfig& config, const placement::MemoryPlan& plan) {
  if (config.experts_wt_policy == "auto") {
    return plan.transposed_weights == "pool" ? experts::WtPolicy::Background : experts::WtPolicy::Persistent;
  }
  return experts::parseWtPolicy(config.experts_wt_policy);
}

}  // namespace

TrainingRunOutcome runTraining(const TrainConfig& config, TrainListener& listener,
                               std::stop_token stop, std::stop_token cancel,
                               store::RunStore* store) {
  const std::string fingerprint = configFingerprint(config);
  const fs::path model_dir = config.model_name_or_path;
  if (!config.expert_weight_path.empty()) {
    throw Error("kt_weight_path (pre-converted KTransformers expert weights) is not supported",
                "remove kt_weight_path: Tandem reads the experts from the model's safetensors");
  }
  // 1. Everything that can be wrong with the inputs, before any file is written.
  const io::ModelConfig model_config = io::readModelConfig(model_dir);
  const placement::MemoryPlan memory_plan = refuseWhenItCannotFit(config, model_config);
  const io::Tokenizer tokenizer = io::Tokenizer::load(model_dir);
  if (config.template_name.empty()) {
    throw Error("no template given", "set template: (e.g. qwen3, qwen3_nothink, llama3, deepseek3)");
  }
  const chat::ChatTemplate& chat_template = chat::templateByName(config.template_name);
  std::vector<chat::EncodedSample> samples = encodeAll(config, config.dataset, tokenizer, chat_template, listener);
  std::vector<chat::EncodedSample> eval_samples =
      config.eval_dataset.empty() ? holdOut(samples, config.val_size, static_cast<uint64_t>(config.seed))
                                  : encodeAll(config, config.eval_dataset, tokenizer, chat_template, listener);

  gpu::LoraSettings lora{static_cast<int>(config.lora_rank), static_cast<double>(config.lora_alpha),
                         config.use_rslora, config.lora_dropout};
  const io::LoraTarget target = io::LoraTarget::parse(joinTargets(config.lora_target));
  model::LoraPlan plan;
  std::unique_ptr<model::PeftAdapter> start_adapter;
  if (!config.adapter_name_or_path.empty()) {
    start_adapter = std::make_unique<model::PeftAdapter>(model::readPeftAdapter(config.adapter_name_or_path, model_config));
    plan = model::loraPlanFor(*start_adapter);
    lora = start_adapter->settings;
    lora.dropout = config.lora_dropout;
    plan.settings = lora;
  } else {
    plan = model::loraPlanFromTarget(target, lora);
  }
  plan.seed = static_cast<uint64_t>(config.seed);
  at::manual_seed(static_cast<uint64_t>(config.seed));
  model::ModelOptions options;
  options.dtype = config.bf16 ? at::kBFloat16 : at::kFloat;
  options.device = pickDevice(config.device);
  if (!config.layer_devices.empty()) {
    options.layer_devices = model::parseLayerDevices(config.layer_devices, model_config.num_hidden_layers, options.device);
  }
  options.experts = model::parseExpertsMode(config.experts_mode);
  options.experts_backend = expertsBackend(config.experts_backend);
  options.experts_format = config.experts_format;
  options.experts_wt_policy = wtPolicy(config, memory_plan);
  if (!config.placement_rule.empty() && config.layer_devices.empty()) {
    applyRulePlacement(placement::toRuntimePlacement(memory_plan.placement), options);
  }
  options.gpu_experts = plannedGpuExperts(memory_plan, options);
  options.gradient_checkpointing = config.gradient_checkpointing;
  options.keep_expert_forward = memory_plan.keep_expert_forward;  // when host RAM has room
  options.loss_chunk_tokens = config.loss_chunk_tokens;
  ThreadPool& pool = ThreadPool::global();
  auto model = model::CausalLm::load(model_dir, options, &plan, pool);
  listener.onMessage(expertsSummary(*model));
  if (start_adapter) model::applyPeftAdapter(*start_adapter, *model);
  std::set<std::string> leaves;
  model->visitLinears([&](const std::string& name, gpu::LoraLinear&) { leaves.insert(name.substr(name.rfind('.') + 1)); });
  if (model_config.isMoe()) leaves.insert({"gate_proj", "up_proj", "down_proj"});
  target.checkAgainst(leaves);

  TrainerSettings settings;
  settings.batch_size = config.per_device_train_batch_size;
  settings.gradient_accumulation_steps = config.gradient_accumulation_steps;
  settings.num_train_epochs = config.num_train_epochs;
  settings.max_steps = config.max_steps;
  settings.schedule = config.lr_scheduler_type;
  settings.learning_rate = config.learning_rate;
  settings.warmup_steps = config.warmup_steps;
  settings.warmup_ratio = config.warmup_ratio;
  settings.max_grad_norm = config.max_grad_norm;
  settings.adamw = {config.adam_beta1, config.adam_beta2, config.adam_epsilon, config.weight_decay};
  settings.seed = static_cast<uint64_t>(config.seed);
  settings.packing = config.packing;
  settings.cutoff_len = config.cutoff_len;
  settings.pad_id = tokenizer.padId().value_or(0);
  settings.logging_steps = config.logging_steps;
  settings.save_steps = config.save_steps;
  settings.save_total_limit = config.save_total_limit.value_or(0);
  settings.output_dir = config.output_dir;
  settings.base_model_name = config.model_name_or_path;
  settings.config_fingerprint = fingerprint;
  if (config.eval_strategy == EvalStrategy::Steps) settings.eval_steps = config.eval_steps.value_or(config.logging_steps);
  settings.eval_each_epoch = config.eval_strategy == EvalStrategy::Epoch;
  settings.eval_batch_size = config.per_device_eval_batch_size;
  Trainer trainer(*model, lora, std::move(samples), settings, pool, std::move(eval_samples));

  // 2. The output dir: refuse someone else's, resume our own.
  TrainingRunOutcome outcome;
  outcome.output_dir = config.output_dir;
  const fs::path checkpoint = prepareOutputDir(config, fingerprint);
  fs::create_directories(config.output_dir);
  io::writeFileAtomically(config.output_dir / kRunFile,
                          nlohmann::json({{"config_fingerprint", fingerprint}, {"config", toYaml(config)}}).dump(2) + "\n");
  if (!checkpoint.empty()) {
    model::applyPeftAdapter(model::readPeftAdapter(checkpoint, model_config), *model);
    trainer.restore(checkpoint);
    outcome.resumed = true;
    outcome.resumed_from_step = model::checkpointStep(checkpoint).value_or(0);
    listener.onMessage("resuming from " + checkpoint.string());
  }

  // 3. Train, recording the run.
  if (store) {
    store->markInterrupted();
    const auto previous = store->findByOutputDir(config.output_dir);
    if (previous && outcome.resumed) {
      outcome.run_id = previous->id;
    } else {
      store::NewRun run;
      run.name = config.output_dir.filename().string();
      run.config_yaml = toYaml(config);
      run.config_fingerprint = fingerprint;
      run.model = config.model_name_or_path;
      run.dataset = joinTargets(config.dataset);
      run.output_dir = config.output_dir;
      run.total_steps = trainer.totalSteps();
      outcome.run_id = store->createRun(run);
    }
    store->setStatus(outcome.run_id, store::RunStatus::Running);
  }
  StoreListener recorder(listener, store, outcome.run_id);
  FirstStepNote note(recorder, *model);
  try {
    outcome.result = trainer.run(stop, cancel, note);
    if (outcome.result.outcome == TrainOutcome::Completed) {
      trainer.saveFinal(recorder);
      if (io::isGgufPath(model_dir)) writeLlamaCppLora(config.output_dir, model_dir, model_config, recorder);
    }
  } catch (const std::exception& e) {
    if (store) store->setStatus(outcome.run_id, store::RunStatus::Failed, e.what());
    throw;
  }
  if (store) {
    const store::RunStatus status = outcome.result.outcome == TrainOutcome::Completed ? store::RunStatus::Completed
                                    : outcome.result.outcome == TrainOutcome::Stopped ? store::RunStatus::Stopped
                                                                                      : store::RunStatus::Interrupted;
    store->setStatus(outcome.run_id, status);
  }
  return outcome;
}

}  // namespace tandem::train
