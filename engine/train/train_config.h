#pragma once
// TrainConfig: the settings of one LoRA fine-tuning run, read from a LLaMA-Factory training YAML.
//
// Users arrive with LLaMA-Factory configs (examples/train_lora/*.yaml), some of them written for
// its KTransformers backend. We read those files as they are: LLaMA-Factory's key names, and the
// defaults of its hparams dataclasses (and of transformers' TrainingArguments underneath them).
// KTransformers keys of all three generations map onto Tandem's own expert-engine settings:
//   gen 1  use_kt, kt_optimize_rule, cpu_infer, chunk_size          (top level)
//   gen 2  kt_backend, kt_method, kt_num_threads, kt_weight_path...  (top level)
//   gen 3  kt_config: { kt_backend | backend, kt_num_threads | num_threads, ... }
// docs/training_config.md lists every key, its default and the KT mapping.
//
// Nothing is silently dropped: an unknown key is an Error naming the nearest known key; a key
// LLaMA-Factory has but Tandem does not implement is an Error saying so; only a short list of
// harmless keys (report_to: none, trust_remote_code, ...) is accepted and ignored.
// Every Error names the file (and line) or the command-line override, and the key.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/model_request.h"

namespace tandem::train {

// transformers' SchedulerType values Tandem implements.
enum class LrSchedulerType : uint8_t { Linear, Cosine, Constant, ConstantWithWarmup };
std::string_view lrSchedulerName(LrSchedulerType type);  // "linear", "cosine", ...

// transformers' IntervalStrategy for evaluation.
enum class EvalStrategy : uint8_t { No, Steps, Epoch };
std::string_view evalStrategyName(EvalStrategy strategy);  // "no", "steps", "epoch"

// resume_from_checkpoint: absent/false, true (the newest checkpoint in output_dir), or a path.
enum class ResumeFrom : uint8_t { None, Latest, Path };

// The model part (dtype, placement, the expert engine: bf16, device, layer_devices,
// kt_optimize_rule as placement_rule, experts_*, gpu_experts, gradient_checkpointing,
// loss_chunk_tokens, task_split) is the ModelRequest every product fills the same way.
struct TrainConfig : model::ModelRequest {
  TrainConfig() {
    gradient_checkpointing = true;
  }  // key: disable_gradient_checkpointing (default false)

  // ### model
  std::string model_name_or_path;    // required: local directory or hub id
  std::string adapter_name_or_path;  // "" = start a new adapter; else continue this one
  std::string template_name;         // key `template`; "" = the tokenizer's chat_template
  bool enable_thinking = true;       // reasoning templates (qwen3): keep the thinking part

  // ### method (stage: sft, do_train: true and finetuning_type: lora are the only values)
  int64_t lora_rank = 8;
  int64_t lora_alpha = 16;  // absent: 2 * lora_rank (LLaMA-Factory's __post_init__)
  double lora_dropout = 0.0;
  std::vector<std::string> lora_target = {"all"};  // "all" or module names (q_proj, ...)
  bool use_rslora = false;                         // scale alpha/sqrt(r) instead of alpha/r
  // LoRA experts (issue 32, docs/training_config.md): "0" off, "auto" (the planner sizes them
  // from the GPU memory left over) or N shared SwiGLU paths per MoE layer, of intermediate le_dim.
  std::string lora_experts = "0";
  int64_t le_dim = 64;

  // ### dataset
  std::vector<std::string> dataset;       // required; names from dataset_dir/dataset_info.json
  std::vector<std::string> eval_dataset;  // empty = none
  std::string dataset_dir = "data";
  int64_t cutoff_len = 2048;           // tokens per sample after truncation
  std::optional<int64_t> max_samples;  // per dataset; absent = all
  double val_size = 0.0;               // [0,1): fraction held out for eval; >= 1: that many samples
  bool train_on_prompt = false;
  bool mask_history = false;  // train on the last turn only
  bool packing = false;       // LLaMA-Factory turns packing on by default only for stage pt
  // Packed samples kept apart: attention within each sample, positions restarting at 0 (packing.h).
  // true forces packing: true, as in LLaMA-Factory.
  bool neat_packing = false;

  // ### train
  int64_t per_device_train_batch_size = 8;  // transformers' default; LF examples use 1
  int64_t gradient_accumulation_steps = 1;
  double learning_rate = 5e-5;
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;  // > 0 wins over num_train_epochs (transformers' rule)
  LrSchedulerType lr_scheduler_type = LrSchedulerType::Linear;
  double warmup_ratio = 0.0;   // [0,1) of the total steps
  int64_t warmup_steps = 0;    // > 0 wins over warmup_ratio (transformers' rule)
  double max_grad_norm = 1.0;  // 0 = no clipping
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  int64_t seed = 42;

  // ### eval (only runs with eval data: eval_dataset or val_size > 0)
  EvalStrategy eval_strategy = EvalStrategy::No;
  std::optional<int64_t> eval_steps;  // absent = logging_steps (transformers' rule)
  int64_t per_device_eval_batch_size = 8;

  // ### output
  std::filesystem::path output_dir;  // required
  bool overwrite_output_dir = false;
  int64_t logging_steps = 500;  // transformers' default; LF examples use 10
  int64_t save_steps = 500;
  std::optional<int64_t> save_total_limit;  // absent = keep every checkpoint
  bool save_only_model = false;             // true: checkpoints without optimizer state
  bool plot_loss = false;
  ResumeFrom resume = ResumeFrom::None;
  std::filesystem::path resume_path;  // set when resume == Path
  // Seconds a rank of a distributed job waits for the others (rendezvous, each all-reduce)
  // before it stops with an error naming the rank that did not answer. LLaMA-Factory's default
  // is 180000000 (years); torch's is 1800.
  int64_t ddp_timeout = 1800;

  // ### tandem: the expert engine (KTransformers keys map here; the rest is in ModelRequest)
  int expert_threads = 0;                    // 0 = one per physical core
  int64_t expert_chunk_tokens = 8192;        // KT chunk_size: tokens per CPU expert pass
  std::filesystem::path expert_weight_path;  // kt_weight_path; "" = experts from the model

  bool operator==(const TrainConfig&) const = default;
};

// Reads and validates a LLaMA-Factory training YAML, then applies `overrides` ("key=value", the
// value parsed as a YAML scalar; "kt_config.backend=AMXBF16" reaches into kt_config; "key=" or
// "key=null" removes the key). An override replaces every spelling of the same setting in the
// file (e.g. experts_backend=generic replaces kt_backend). Throws tandem::Error.
TrainConfig loadTrainConfig(const std::filesystem::path& yaml_path,
                            const std::vector<std::string>& overrides = {});

// The same from text; `label` names the source in errors (usually the file path).
TrainConfig parseTrainConfig(std::string_view yaml_text, const std::string& label,
                             const std::vector<std::string>& overrides = {});

// A canonical LLaMA-Factory-style YAML of every setting (Tandem's own names for the expert
// engine). parseTrainConfig(toYaml(c), ...) == c, and LLaMA-Factory reads the non-Tandem part.
std::string toYaml(const TrainConfig& config);

// 16 hex digits identifying the settings that change the trained adapter: everything except
// output_dir, overwrite_output_dir, logging_steps, save_steps, save_total_limit, save_only_model,
// resume_from_checkpoint, plot_loss, ddp_timeout, the eval schedule, expert_threads and
// experts_wt_policy.
std::string configFingerprint(const TrainConfig& config);

}  // namespace tandem::train
