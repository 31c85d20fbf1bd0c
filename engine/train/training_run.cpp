#include "engine/train/training_run.h"

#include <cmath>
#include <optional>
#include <random>
#include <sstream>

#include "engine/chat/chat_template.h"
#include "engine/chat/supervised_encoder.h"
#include "engine/chat/tokenizer_encoder.h"
#include "engine/core/error.h"
#include "engine/core/hash.h"
#include "engine/core/log.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/memory_sample.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/io/atomic_file.h"
#include "engine/io/gguf_model.h"
#include "engine/io/lora_target.h"
#include "engine/io/tokenizer.h"
#include "engine/model/adapter_files.h"
#include "engine/model/checkpoint_dir.h"
#include "engine/model/machine_probe.h"
#include "engine/model/model.h"
#include "engine/model/model_report.h"
#include "engine/model/model_resolver.h"
#include "engine/store/run_store.h"
#include "engine/train/data_parallel_run.h"
#include "engine/train/dataset.h"
#include "engine/train/memory_sampling.h"
#include "engine/train/output_dir.h"
#include "engine/train/packing.h"
#include "engine/train/split_calibration.h"
#include "engine/train/tokenized_cache.h"
#include "engine/train/training_plan.h"

namespace tandem::train {

namespace {

namespace fs = std::filesystem;

std::string joinTargets(const std::vector<std::string>& targets) {
  std::string out;
  for (const std::string& t : targets) out += (out.empty() ? "" : ",") + t;
  return out;
}

PackingMode packingMode(const TrainConfig& config) {
  if (config.neat_packing) return PackingMode::Neat;
  return config.packing ? PackingMode::Plain : PackingMode::Off;
}

std::vector<chat::EncodedSample> encodeAll(const TrainConfig& config,
                                           const std::vector<std::string>& names,
                                           const io::Tokenizer& tokenizer,
                                           const chat::ChatTemplate& chat_template,
                                           TrainListener& listener) {
  DatasetReport report;
  const std::vector<chat::Conversation> conversations =
      loadDatasets(config.dataset_dir, names, config.max_samples, report);
  listener.onMessage(report.summary());
  // Tokenising is the slow part; a run over the same data and settings reads it back instead.
  // The key hashes the conversations as converted, not the files they came from: that covers
  // dataset_info.json (columns, tags, formatting) and directory datasets (tokenized_cache.h).
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
    files.push_back(fs::path(config.model_name_or_path) / "tokenizer_config.json");
  }
  settings << "template=" << config.template_name << " thinking=" << config.enable_thinking
           << " cutoff=" << encodingCutoff(config.cutoff_len, packingMode(config))
           << " prompt=" << config.train_on_prompt << " history=" << config.mask_history
           << " max=" << config.max_samples.value_or(-1) << " datasets=" << joinTargets(names)
           << " rows=" << conversations.size();
  const fs::path cache_file =
      tokenizedCacheDir() / (tokenizedCacheKey(conversations, files, settings.str()) + ".bin");
  if (auto cached = readTokenizedCache(cache_file)) {
    listener.onMessage("tokenised data from the cache " + cache_file.string());
    return std::move(*cached);
  }
  const chat::TokenizerEncoder encoder(tokenizer, chat_template);
  chat::SupervisedOptions options;
  // With packing LLaMA-Factory encodes to cutoff_len - 1 (packing.h); the cache key has it.
  options.cutoff_len = encodingCutoff(config.cutoff_len, packingMode(config));
  options.train_on_prompt = config.train_on_prompt;
  options.mask_history = config.mask_history;
  std::vector<chat::EncodedSample> samples;
  samples.reserve(conversations.size());
  for (const chat::Conversation& c : conversations)
    samples.push_back(chat::encodeSupervised(c, chat_template, encoder, options));
  try {
    writeTokenizedCache(cache_file, samples);
  } catch (const Error& e) {
    logWarn() << "could not cache the tokenised data: " << e.message();
  }
  return samples;
}

// val_size held out as LLaMA-Factory does (a fraction, rounded up, or a count), from a shuffle by
// the seed (our own, so the split is not byte-for-byte `datasets`' train_test_split).
std::vector<chat::EncodedSample> holdOut(std::vector<chat::EncodedSample>& samples, double val_size,
                                         uint64_t seed) {
  if (val_size <= 0 || samples.empty()) return {};
  const auto n = static_cast<int64_t>(samples.size());
  const int64_t n_eval = std::min<int64_t>(
      n - 1, val_size < 1 ? static_cast<int64_t>(std::ceil(val_size * static_cast<double>(n)))
                          : static_cast<int64_t>(val_size));
  if (n_eval <= 0) {
    throw Error("val_size " + std::to_string(val_size) + " leaves no training samples out of " +
                    std::to_string(n),
                "lower val_size");
  }
  std::mt19937_64 rng(seed);
  for (int64_t i = n; i > 1; --i) std::swap(samples[i - 1], samples[rng() % i]);
  std::vector<chat::EncodedSample> eval(std::make_move_iterator(samples.end() - n_eval),
                                        std::make_move_iterator(samples.end()));
  samples.resize(n - n_eval);
  return eval;
}

// What to do with the output dir: start in it afresh, clear this tool's previous run from it
// first, or resume from a checkpoint. Writes nothing, so it runs both before the dir is locked
// (a refused run leaves no trace) and again under the lock (the dir may have changed meanwhile).
struct OutputDirPlan {
  bool clear = false;
  fs::path resume_from;  // empty: start fresh
};

OutputDirPlan planOutputDir(const TrainConfig& config, const std::string& fingerprint) {
  const fs::path& dir = config.output_dir;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return {};
  bool empty = true;  // the lock file alone is a run that died before it wrote its marker
  for (const auto& entry : fs::directory_iterator(dir))
    empty = empty && entry.path().filename() == kRunLockFile;
  if (empty) return {};
  const std::optional<RunMarker> marker = readRunMarker(dir);
  if (config.overwrite_output_dir) {
    requireOnlyOwnRun(dir);  // throws, listing what Tandem did not write
    return {true, {}};
  }
  if (!marker || marker->config_fingerprint.empty()) {
    throw Error("Output directory " + dir.string() + " already exists and is not empty",
                "set overwrite_output_dir: true, or choose another output_dir");
  }
  if (marker->config_fingerprint != fingerprint) {
    throw Error("output_dir " + dir.string() + " holds a run with a different configuration",
                "set overwrite_output_dir: true to start over there, or choose another output_dir");
  }
  if (config.resume == ResumeFrom::Path) return {false, config.resume_path};
  return {false, model::lastCheckpoint(dir)};
}

class StoreListener : public TrainListener {
 public:
  StoreListener(TrainListener& inner, store::RunStore* store, int64_t run)
      : inner_(inner), store_(store), run_(run) {}
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
  void onMemory(const MemorySnapshot& s) override { inner_.onMemory(s); }
  void onPaused() override {
    if (store_) {
      store_->setStatus(run_, store::RunStatus::Paused);
      store_->recordEvent(run_, "paused", "paused at step boundary");
    }
    inner_.onPaused();
  }
  void onResumed() override {
    if (store_) {
      store_->setStatus(run_, store::RunStatus::Running);
      store_->recordEvent(run_, "resumed", "resumed");
    }
    inner_.onResumed();
  }

 private:
  TrainListener& inner_;
  store::RunStore* store_;
  int64_t run_;
};

// Says, before the run's first step is reported, how much of the routed work resident experts
// took in it (model_report.h); then passes everything through.
class FirstStepNote : public TrainListener {
 public:
  FirstStepNote(TrainListener& inner, const model::Model& model) : inner_(inner), model_(model) {}
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
  void onMemory(const MemorySnapshot& s) override { inner_.onMemory(s); }
  void onPaused() override { inner_.onPaused(); }
  void onResumed() override { inner_.onResumed(); }

 private:
  TrainListener& inner_;
  const model::Model& model_;
  bool said_ = false;
};

// Step 1: the memory plan on this machine, before anything is loaded. A run that cannot fit is
// refused with the planner's advice instead of dying at step 0 (or hour 3).
placement::MemoryPlan planOnThisMachine(const TrainConfig& config,
                                        const io::ModelConfig& model_config,
                                        const placement::Hardware& hardware) {
  if (!config.expert_weight_path.empty()) {
    throw Error("kt_weight_path (pre-converted KTransformers expert weights) is not supported",
                "remove kt_weight_path: Tandem reads the experts from the model's safetensors");
  }
  placement::MemoryPlan plan = planTraining(config, model_config, hardware);
  model::requireFits(plan, "this run");
  return plan;
}

// Step 2: the tokenised training and evaluation samples.
struct TrainingData {
  std::vector<chat::EncodedSample> samples;
  std::vector<chat::EncodedSample> eval_samples;
  int32_t pad_id = 0;
};

TrainingData prepareData(const TrainConfig& config, TrainListener& listener) {
  const io::Tokenizer tokenizer = io::Tokenizer::load(config.model_name_or_path);
  if (config.template_name.empty()) {
    throw Error("no template given",
                "set template: (e.g. qwen3, qwen3_nothink, llama3, deepseek3)");
  }
  const chat::ChatTemplate& chat_template = chat::templateByName(config.template_name);
  TrainingData data;
  data.samples = encodeAll(config, config.dataset, tokenizer, chat_template, listener);
  data.eval_samples =
      config.eval_dataset.empty()
          ? holdOut(data.samples, config.val_size, static_cast<uint64_t>(config.seed))
          : encodeAll(config, config.eval_dataset, tokenizer, chat_template, listener);
  data.pad_id = tokenizer.padId().value_or(0);
  return data;
}

// Step 3: the model as the plan places it, with fresh adapters on lora_target's modules, or the
// adapter it continues.
struct LoadedModel {
  std::unique_ptr<model::Model> model;
  gpu::LoraSettings lora;
};

LoadedModel loadModel(const TrainConfig& config, const io::ModelConfig& model_config,
                      const placement::MemoryPlan& plan, TrainListener& listener) {
  LoadedModel loaded;
  loaded.lora = {static_cast<int>(config.lora_rank), static_cast<double>(config.lora_alpha),
                 config.use_rslora, config.lora_dropout};
  const io::LoraTarget target = io::LoraTarget::parse(joinTargets(config.lora_target));
  model::LoraPlan lora_plan;
  if (!config.adapter_name_or_path.empty()) {
    lora_plan = model::adapterLoraPlan(config.adapter_name_or_path, model_config);
    loaded.lora = lora_plan.settings;
    loaded.lora.dropout = config.lora_dropout;
    lora_plan.settings = loaded.lora;
  } else {
    lora_plan = model::loraPlanFromTarget(target, loaded.lora);
  }
  lora_plan.seed = static_cast<uint64_t>(config.seed);
  if (lora_plan.lora_experts == 0) {  // an adapter continued with its own LE keeps them
    const placement::LoraExpertsChoice le = loraExpertsFor(config, model_config, plan);
    lora_plan.lora_experts = le.paths;
    lora_plan.le_dim = le.le_dim;
    if (!le.reason.empty()) listener.onMessage(le.reason);
  }
  model::LoraTraining::seedDropout(static_cast<uint64_t>(config.seed));
  model::ModelOptions options = model::resolveModelOptions(config, model_config, plan);
  calibrateExpertSplit(options, config, model_config, lora_plan,
                       [&](const std::string& line) { listener.onMessage(line); });
  // Long sequences on a GPU: the caching allocator in expandable segments, so what it reserves
  // tracks what the tensors use (docs/long_context.md, "GPU memory: allocated and reserved").
  if (options.layerDevice(0).isGpu() &&
      (config.offload_checkpoints || config.per_device_train_batch_size * config.cutoff_len >=
                                         gpu::kExpandableSegmentsFromTokens)) {
    const bool on = gpu::useExpandableSegments();
    listener.onMessage(std::string("GPU allocator: expandable segments ") +
                       (on ? "on (long sequences)" : "off (PYTORCH_CUDA_ALLOC_CONF says so)"));
  }
  loaded.model =
      model::Model::load(config.model_name_or_path, options, &lora_plan, ThreadPool::global());
  listener.onMessage(model::placementSummary(loaded.model->placement()));
  listener.onMessage(model::expertsSummary(*loaded.model));
  if (!config.adapter_name_or_path.empty())
    model::applyAdapter(config.adapter_name_or_path, *loaded.model);
  target.checkAgainst(loaded.model->loraLeaves());
  return loaded;
}

TrainerSettings trainerSettings(const TrainConfig& config, int32_t pad_id,
                                const std::string& fingerprint, model::ProcessGroup* group) {
  TrainerSettings settings;
  settings.group = group;
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
  settings.neat_packing = config.neat_packing;
  settings.cutoff_len = config.cutoff_len;
  settings.pad_id = pad_id;
  settings.logging_steps = config.logging_steps;
  settings.save_steps = config.save_steps;
  settings.save_total_limit = config.save_total_limit.value_or(0);
  settings.output_dir = config.output_dir;
  settings.base_model_name = config.model_name_or_path;
  settings.config_fingerprint = fingerprint;
  if (config.eval_strategy == EvalStrategy::Steps)
    settings.eval_steps = config.eval_steps.value_or(config.logging_steps);
  settings.eval_each_epoch = config.eval_strategy == EvalStrategy::Epoch;
  settings.eval_batch_size = config.per_device_eval_batch_size;
  return settings;
}

void resumeFrom(const fs::path& checkpoint, model::Model& model, Trainer& trainer,
                TrainingRunOutcome& outcome, TrainListener& listener) {
  model::applyAdapter(checkpoint, model);
  const std::string note = trainer.restore(checkpoint);
  outcome.resumed = true;
  outcome.resumed_from_step = model::checkpointStep(checkpoint).value_or(0);
  listener.onMessage("resuming from " + checkpoint.string());
  if (!note.empty()) listener.onMessage(note);
}

// Step 4: the output dir, refused when it holds someone else's run or another live run holds
// it, resumed from its newest checkpoint when it holds this one; then locked for this run (the
// returned lock), swept of dead saves' temp dirs, and marked as this run's.
platform::FileLock prepareOutput(const TrainConfig& config, const std::string& fingerprint,
                                 model::Model& model, Trainer& trainer, TrainingRunOutcome& outcome,
                                 TrainListener& listener) {
  planOutputDir(config, fingerprint);  // refusals before the lock file is made
  platform::FileLock lock = lockOutputDir(config.output_dir);
  const OutputDirPlan plan = planOutputDir(config, fingerprint);
  if (plan.clear) clearOwnRun(config.output_dir);
  if (const int swept = sweepCheckpointTemps(config.output_dir); swept > 0)
    listener.onMessage("removed " + std::to_string(swept) + " unfinished checkpoint save(s)");
  writeRunMarker(config.output_dir, fingerprint, toYaml(config));
  if (plan.resume_from.empty()) {
    setAsidePreviousLog(config.output_dir);
    return lock;
  }
  resumeFrom(plan.resume_from, model, trainer, outcome, listener);
  return lock;
}

// Ranks other than 0 of a job write nothing: once rank 0 has prepared the output dir, they
// resume from what it resumes from (requireSameResume checks they found the same).
void followOutput(const TrainConfig& config, const std::string& fingerprint, model::Model& model,
                  Trainer& trainer, TrainingRunOutcome& outcome, TrainListener& listener) {
  const OutputDirPlan plan = planOutputDir(config, fingerprint);
  if (!plan.resume_from.empty()) resumeFrom(plan.resume_from, model, trainer, outcome, listener);
}

// The run's row in the store (the same row again when it resumes), marked running.
int64_t recordRun(store::RunStore& store, const TrainConfig& config, const std::string& fingerprint,
                  const Trainer& trainer, bool resumed) {
  store.markInterrupted();
  if (const auto previous = store.findByOutputDir(config.output_dir); previous && resumed) {
    store.setStatus(previous->id, store::RunStatus::Running);
    return previous->id;
  }
  store::NewRun run;
  run.name = config.output_dir.filename().string();
  run.config_yaml = toYaml(config);
  run.config_fingerprint = fingerprint;
  run.model = config.model_name_or_path;
  run.dataset = joinTargets(config.dataset);
  run.output_dir = config.output_dir;
  run.total_steps = trainer.totalSteps();
  const int64_t id = store.createRun(run);
  store.setStatus(id, store::RunStatus::Running);
  return id;
}

store::RunStatus finalStatus(TrainOutcome outcome) {
  switch (outcome) {
    case TrainOutcome::Completed: return store::RunStatus::Completed;
    case TrainOutcome::Stopped: return store::RunStatus::Stopped;
    case TrainOutcome::Cancelled: return store::RunStatus::Interrupted;
  }
  return store::RunStatus::Interrupted;
}

// A run on a GGUF model also leaves its adapter as llama.cpp reads it, beside the PEFT one.
void writeLlamaCppLora(const fs::path& output_dir, const fs::path& gguf_model,
                       TrainListener& listener) {
  const fs::path file = output_dir / "adapter_model.gguf";
  model::exportLlamaCppAdapter(output_dir, gguf_model, file);
  listener.onMessage("llama.cpp LoRA written to " + file.string() + " (llama-cli -m " +
                     gguf_model.string() + " --lora " + file.string() + ")");
  if (model::adapterHasLoraExperts(output_dir)) {
    listener.onMessage("warning: " + file.string() + " holds the LoRA adapter without its LoRA " +
                       "experts (llama.cpp has no place for them): llama.cpp with it is a " +
                       "different model from the one trained; Tandem's chat and serve load both");
  }
}

}  // namespace

TrainingRunOutcome runTraining(const TrainConfig& config, TrainListener& listener,
                               const RunControl& control, store::RunStore* store) {
  const std::string fingerprint = configFingerprint(config);
  // One rank of a data-parallel job: rank 0 alone owns the output dir and the run store.
  const std::unique_ptr<model::ProcessGroup> group = joinJobFromEnvironment(config, listener);
  const bool rank0 = !group || group->rank() == 0;
  if (!rank0) store = nullptr;
  // A second run into a busy output_dir is turned away before it loads anything.
  if (rank0) refuseIfOutputDirBusy(config.output_dir);
  // Everything that can be wrong with the inputs is found before any file is written.
  const io::ModelConfig model_config = io::readModelConfig(config.model_name_or_path);
  // Probed once, before loading: an out-of-memory error judges the run by the same machine.
  const placement::Hardware hardware = model::probeMachine();
  const placement::MemoryPlan plan = planOnThisMachine(config, model_config, hardware);
  if (group) warnIfRanksOverfillTheNode(plan, listener);
  listener.onMemory(gpu::sampleMemory("planned, nothing loaded yet", 0));
  TrainingData data = prepareData(config, listener);
  if (group) requireSameData(*group, data.samples);
  LoadedModel loaded;
  {
    // The load is one long call: a sampling thread shows its memory growing.
    const MemorySampling sampling(listener, "loading the model");
    loaded = loadModel(config, model_config, plan, listener);
  }
  TrainerSettings settings = trainerSettings(config, data.pad_id, fingerprint, group.get());
  settings.out_of_memory_advice = [&config, &model_config, &plan, &hardware] {
    return longestSequenceAdvice(config, model_config, plan, hardware);
  };
  Trainer trainer(*loaded.model, loaded.lora, std::move(data.samples), std::move(settings),
                  ThreadPool::global(), std::move(data.eval_samples));
  if (!trainer.packingSummary().empty()) listener.onMessage(trainer.packingSummary());
  listener.onMemory(gpu::sampleMemory("model and optimizer ready", 0));

  TrainingRunOutcome outcome;
  outcome.output_dir = config.output_dir;
  outcome.applied_placement = loaded.model->placement();
  std::optional<platform::FileLock> output_lock;
  if (rank0)
    output_lock.emplace(
        prepareOutput(config, fingerprint, *loaded.model, trainer, outcome, listener));
  if (group) {
    group->barrier("the wait for rank 0 to prepare output_dir");
    if (!rank0) followOutput(config, fingerprint, *loaded.model, trainer, outcome, listener);
    requireSameResume(*group, outcome.resumed ? outcome.resumed_from_step : -1, config.output_dir);
  }
  if (store) outcome.run_id = recordRun(*store, config, fingerprint, trainer, outcome.resumed);
  StoreListener recorder(listener, store, outcome.run_id);
  FirstStepNote note(recorder, *loaded.model);
  try {
    outcome.result = trainer.run(control, note);
    if (outcome.result.outcome == TrainOutcome::Completed) {
      trainer.saveFinal(recorder);
      if (rank0 && io::isGgufPath(config.model_name_or_path)) {
        writeLlamaCppLora(config.output_dir, config.model_name_or_path, recorder);
      }
    }
  } catch (const std::exception& e) {
    if (store) store->setStatus(outcome.run_id, store::RunStatus::Failed, e.what());
    throw;
  }
  if (store) store->setStatus(outcome.run_id, finalStatus(outcome.result.outcome));
  return outcome;
}

}  // namespace tandem::train
