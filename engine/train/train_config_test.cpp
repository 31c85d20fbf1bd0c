#include "engine/train/train_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "engine/core/error.h"

namespace tandem::train {
namespace {

// LLaMA-Factory examples/train_lora/qwen3_lora_sft.yaml, verbatim (comments included).
constexpr const char* kQwen3LoraSft = R"(### model
model_name_or_path: Qwen/Qwen3-4B-Instruct-2507
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all

### dataset
dataset: identity
template: qwen3_nothink
cutoff_len: 2048
max_samples: 1000
preprocessing_num_workers: 16
dataloader_num_workers: 4

### output
output_dir: saves/qwen3-4b/lora/sft
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
save_only_model: false
report_to: none  # choices: [none, wandb, tensorboard, swanlab, mlflow]

### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
resume_from_checkpoint: null

### eval
# eval_dataset: alpaca_en_demo
# val_size: 0.1
# per_device_eval_batch_size: 1
# eval_strategy: steps
# eval_steps: 500
)";

// LLaMA-Factory examples/train_lora/deepseek3_lora_sft_kt.yaml (KTransformers generation 1).
constexpr const char* kDeepseek3LoraSftKt = R"(### model
model_name_or_path: opensourcerelease/DeepSeek-V3-bf16
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all

### dataset
dataset: identity, alpaca_en_demo
template: deepseek
cutoff_len: 2048
max_samples: 100000
overwrite_cache: true
preprocessing_num_workers: 16
dataloader_num_workers: 4

### output
output_dir: saves/Kllama_deepseekV3
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
save_only_model: false
report_to: none  # choices: [none, wandb, tensorboard, swanlab, mlflow]

### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
resume_from_checkpoint: null

### ktransformers
use_kt: true # use KTransformers as LoRA sft backend
kt_optimize_rule: examples/kt_optimize_rules/DeepSeek-V3-Chat-sft-amx-multi-gpu.yaml
cpu_infer: 128
chunk_size: 8192
)";

// The three required keys; tests append lines to it.
constexpr const char* kMinimal =
    "model_name_or_path: /models/qwen3-30b-a3b\n"
    "dataset: identity\n"
    "output_dir: saves/run\n";

TrainConfig parse(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return parseTrainConfig(yaml, "cfg.yaml", overrides);
}

TEST(TrainConfigTest, ReadsLlamaFactoryQwen3Example) {
  TrainConfig c = parse(kQwen3LoraSft);
  EXPECT_EQ(c.model_name_or_path, "Qwen/Qwen3-4B-Instruct-2507");
  EXPECT_EQ(c.lora_rank, 8);
  EXPECT_EQ(c.lora_alpha, 16);
  EXPECT_EQ(c.lora_target, std::vector<std::string>{"all"});
  EXPECT_EQ(c.dataset, std::vector<std::string>{"identity"});
  EXPECT_EQ(c.template_name, "qwen3_nothink");
  EXPECT_EQ(c.cutoff_len, 2048);
  EXPECT_EQ(c.max_samples, 1000);
  EXPECT_EQ(c.output_dir, "saves/qwen3-4b/lora/sft");
  EXPECT_EQ(c.logging_steps, 10);
  EXPECT_EQ(c.save_steps, 500);
  EXPECT_TRUE(c.plot_loss);
  EXPECT_TRUE(c.overwrite_output_dir);
  EXPECT_FALSE(c.save_only_model);
  EXPECT_EQ(c.per_device_train_batch_size, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-4);
  EXPECT_DOUBLE_EQ(c.num_train_epochs, 3.0);
  EXPECT_EQ(c.lr_scheduler_type, LrSchedulerType::Cosine);
  EXPECT_DOUBLE_EQ(c.warmup_ratio, 0.1);
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.resume, ResumeFrom::None);
  EXPECT_TRUE(c.gradient_checkpointing);
  EXPECT_EQ(c.experts_backend, "auto");
}

TEST(TrainConfigTest, ReadsKTransformersGeneration1Example) {
  TrainConfig c = parse(kDeepseek3LoraSftKt);
  EXPECT_EQ(c.model_name_or_path, "opensourcerelease/DeepSeek-V3-bf16");
  EXPECT_EQ(c.dataset, (std::vector<std::string>{"identity", "alpaca_en_demo"}));
  EXPECT_EQ(c.template_name, "deepseek");
  EXPECT_EQ(c.max_samples, 100000);
  EXPECT_EQ(c.placement_rule, "examples/kt_optimize_rules/DeepSeek-V3-Chat-sft-amx-multi-gpu.yaml");
  EXPECT_EQ(c.expert_threads, 128);
  EXPECT_EQ(c.expert_chunk_tokens, 8192);
  EXPECT_EQ(c.experts_backend, "auto");
}

TEST(TrainConfigTest, MissingKeysTakeLlamaFactoryDefaults) {
  TrainConfig expected;
  expected.model_name_or_path = "/models/qwen3-30b-a3b";
  expected.dataset = {"identity"};
  expected.output_dir = "saves/run";
  TrainConfig c = parse(kMinimal);
  EXPECT_EQ(c, expected);
  EXPECT_EQ(c.lora_rank, 8);
  EXPECT_EQ(c.lora_alpha, 16);
  EXPECT_DOUBLE_EQ(c.learning_rate, 5e-5);
  EXPECT_EQ(c.per_device_train_batch_size, 8);
  EXPECT_EQ(c.logging_steps, 500);
  EXPECT_EQ(c.max_steps, -1);
  EXPECT_EQ(c.lr_scheduler_type, LrSchedulerType::Linear);
  EXPECT_EQ(c.seed, 42);
  EXPECT_EQ(c.dataset_dir, "data");
  EXPECT_TRUE(c.enable_thinking);
  EXPECT_FALSE(c.packing);
  EXPECT_EQ(c.loss_chunk_tokens, 1024);
}

TEST(TrainConfigTest, LoraAlphaDefaultsToTwiceTheRank) {
  struct Case {
    std::string lines;
    int64_t rank;
    int64_t alpha;
  };
  const std::vector<Case> cases = {
      {"", 8, 16},
      {"lora_rank: 32\n", 32, 64},
      {"lora_rank: 32\nlora_alpha: 16\n", 32, 16},
      {"lora_alpha: 8\n", 8, 8},
  };
  for (const Case& k : cases) {
    TrainConfig c = parse(kMinimal + k.lines);
    EXPECT_EQ(c.lora_rank, k.rank) << k.lines;
    EXPECT_EQ(c.lora_alpha, k.alpha) << k.lines;
  }
  // The override of the rank also moves the derived alpha.
  EXPECT_EQ(parse(kMinimal, {"lora_rank=4"}).lora_alpha, 8);
}

TEST(TrainConfigTest, EveryKTransformersGenerationMapsToTheSameSettings) {
  const std::vector<std::string> generations = {
      // gen 1: LLaMA-Factory KTransformersArguments
      "use_kt: true\nkt_optimize_rule: rules/Qwen3Moe-sft-amx.yaml\ncpu_infer: 48\n"
      "chunk_size: 4096\nexperts_backend: amx_bf16\n",
      // gen 2: flat kt_* keys
      "use_kt: true\nkt_backend: AMXBF16\nkt_num_threads: 48\n"
      "kt_optimize_rule: rules/Qwen3Moe-sft-amx.yaml\nkt_chunk_size: 4096\n"
      "kt_tp_enabled: true\nkt_threadpool_count: 2\nkt_share_backward_bb: true\n",
      // gen 3: nested kt_config, LLaMA-Factory's kt_-prefixed spelling
      "use_kt: true\nkt_config:\n  kt_backend: AMXBF16\n  kt_num_threads: 48\n"
      "  kt_optimize_rule: rules/Qwen3Moe-sft-amx.yaml\n  kt_chunk_size: 4096\n"
      "  kt_expert_weight_format: bf16\n  kt_max_cache_depth: 2\n  kt_lora_rank: 8\n",
      // gen 3 without the prefix
      "kt_config:\n  enabled: true\n  backend: amxbf16\n  num_threads: 48\n"
      "  optimize_rule: rules/Qwen3Moe-sft-amx.yaml\n  chunk_size: 4096\n",
  };
  for (const std::string& lines : generations) {
    TrainConfig c = parse(kMinimal + lines);
    EXPECT_EQ(c.experts_backend, "amx_bf16") << lines;
    EXPECT_EQ(c.expert_threads, 48) << lines;
    EXPECT_EQ(c.placement_rule, "rules/Qwen3Moe-sft-amx.yaml") << lines;
    EXPECT_EQ(c.expert_chunk_tokens, 4096) << lines;
  }
}

TEST(TrainConfigTest, KTransformersBackendNamesMapToTandemBackends) {
  const std::vector<std::pair<std::string, std::string>> names = {
      {"AMXBF16", "amx_bf16"},  {"AMXInt8", "amx_int8"},       {"AMXINT8", "amx_int8"},
      {"llamafile", "auto"},    {"LLAMAFILE", "auto"},         {"auto", "auto"},
      {"amx_bf16", "amx_bf16"}, {"AVX512BF16", "avx512_bf16"}, {"onednn", "onednn"},
      {"generic", "generic"},   {"avx512", "avx512"},          {"avx2", "avx2"}};
  for (const auto& [kt, tandem_name] : names) {
    EXPECT_EQ(parse(kMinimal + ("kt_backend: " + kt + "\n")).experts_backend, tandem_name) << kt;
    EXPECT_EQ(parse(kMinimal + ("kt_method: " + kt + "\n")).experts_backend, tandem_name) << kt;
  }
  // The same setting under two spellings is fine when they agree.
  EXPECT_EQ(parse(kMinimal + std::string("kt_backend: AMXBF16\nexperts_backend: amx_bf16\n"))
                .experts_backend,
            "amx_bf16");
}

TEST(TrainConfigTest, ExpertFormatAndWtPolicyKeys) {
  const TrainConfig defaults = parse(kMinimal);
  EXPECT_EQ(defaults.experts_format, "auto");
  EXPECT_EQ(defaults.experts_wt_policy, "auto");
  for (const char* format : {"auto", "bf16", "int8", "fp8"}) {
    EXPECT_EQ(parse(kMinimal + ("experts_format: " + std::string(format) + "\n")).experts_format,
              format);
  }
  // KTransformers' spelling (kt_expert_weight_format, any case, all three generations) feeds it.
  EXPECT_EQ(parse(kMinimal + std::string("kt_expert_weight_format: FP8\n")).experts_format, "fp8");
  EXPECT_EQ(
      parse(kMinimal + std::string("kt_config:\n  expert_weight_format: int8\n")).experts_format,
      "int8");
  const TrainConfig kt_int8 = parse(kMinimal + std::string("kt_config:\n  kt_backend: AMXInt8\n"
                                                           "  kt_expert_weight_format: int8\n"));
  EXPECT_EQ(kt_int8.experts_backend, "amx_int8");
  EXPECT_EQ(kt_int8.experts_format, "int8");
  // auto goes with every backend; bf16 / fp8 with the bf16 ones, int8 with the fp32 ones too.
  EXPECT_EQ(
      parse(kMinimal + std::string("kt_backend: AMXInt8\nexperts_format: auto\n")).experts_format,
      "auto");
  EXPECT_EQ(
      parse(kMinimal + std::string("kt_backend: AMXBF16\nexperts_format: fp8\n")).experts_format,
      "fp8");
  EXPECT_EQ(parse(kMinimal + std::string("experts_backend: avx512\nexperts_format: int8\n"))
                .experts_format,
            "int8");
  // int4 (issue 27): its group and symmetry fold into the one format string the engine parses.
  EXPECT_EQ(parse(kMinimal + std::string("experts_format: int4\n")).experts_format, "int4");
  EXPECT_EQ(parse(kMinimal + std::string("experts_format: blocks\n")).experts_format, "blocks");
  EXPECT_EQ(parse(kMinimal + std::string("experts_format: int4\nexperts_int4_group: 64\n"
                                         "experts_int4_symmetric: false\n"))
                .experts_format,
            "int4:g64:asym");
  EXPECT_EQ(parse(kMinimal + std::string("kt_expert_weight_format: int4\n")).experts_format,
            "int4");
  EXPECT_EQ(
      parse(kMinimal + std::string("kt_config:\n  kt_expert_weight_format: INT4\n")).experts_format,
      "int4");
  EXPECT_EQ(parse(kMinimal + std::string("experts_format: int4:g128\n")).experts_format,
            "int4:g128");
  EXPECT_THROW(parse(kMinimal + std::string("experts_int4_group: 64\n")), Error);
  EXPECT_THROW(parse(kMinimal + std::string("experts_format: int4\nexperts_int4_group: 48\n")),
               Error);
  EXPECT_THROW(parse(kMinimal + std::string("experts_format: int4\nkt_backend: AMXInt8\n")), Error);
  EXPECT_THROW(parse(kMinimal + std::string("experts_format: int4:g48\n")), Error);
  EXPECT_EQ(parse(kMinimal + std::string("experts_wt_policy: on_demand\n")).experts_wt_policy,
            "on_demand");
  EXPECT_EQ(parse(kMinimal + std::string("experts_wt_policy: background\n")).experts_wt_policy,
            "background");
  EXPECT_EQ(parse(kMinimal, {"experts_wt_policy=persistent"}).experts_wt_policy, "persistent");
  // The Tandem key overrides the KT spelling; the format changes the trained result, the policy
  // not.
  const std::string kt = kMinimal + std::string("kt_config:\n  kt_expert_weight_format: bf16\n");
  EXPECT_EQ(parse(kt, {"experts_format=int8"}).experts_format, "int8");
  EXPECT_NE(configFingerprint(parse(kt, {"experts_format=int8"})), configFingerprint(parse(kt)));
  EXPECT_EQ(configFingerprint(parse(kt, {"experts_wt_policy=on_demand"})),
            configFingerprint(parse(kt)));
}

TEST(TrainConfigTest, OverridesApplyAfterTheFile) {
  const std::string yaml =
      kMinimal + std::string(
                     "learning_rate: 5.0e-5\nmax_samples: 100\n"
                     "kt_config:\n  kt_backend: AMXInt8\n  kt_num_threads: 8\n");
  TrainConfig c = parse(
      yaml, {"learning_rate=1e-4", "lora_target=q_proj,v_proj", "kt_config.backend=AMXBF16",
             "max_samples=", "resume_from_checkpoint=true", "cpu_infer=16", "template=qwen3"});
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-4);
  EXPECT_EQ(c.lora_target, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(c.experts_backend, "amx_bf16");
  EXPECT_FALSE(c.max_samples.has_value());
  EXPECT_EQ(c.resume, ResumeFrom::Latest);
  EXPECT_EQ(c.expert_threads, 16);  // replaces kt_config.kt_num_threads
  EXPECT_EQ(c.template_name, "qwen3");
  // A Tandem spelling overrides a KT spelling of the same setting, and vice versa.
  EXPECT_EQ(parse(yaml, {"experts_backend=generic"}).experts_backend, "generic");
  EXPECT_EQ(parse(kMinimal, {"kt_config.kt_backend=AMXInt8"}).experts_backend, "amx_int8");
  EXPECT_EQ(parse(kMinimal, {"resume_from_checkpoint=saves/run/checkpoint-500"}).resume_path,
            "saves/run/checkpoint-500");
}

TEST(TrainConfigTest, GpuExpertsTakeKtNumGpuExperts) {
  EXPECT_EQ(parse(kMinimal).gpu_experts, "auto");
  EXPECT_EQ(parse(kMinimal + std::string("kt_config:\n  kt_num_gpu_experts: 4\n")).gpu_experts,
            "4");
  EXPECT_EQ(parse(kMinimal + std::string("gpu_experts: AUTO\n")).gpu_experts, "auto");
  EXPECT_EQ(parse(kMinimal + std::string("gpu_experts: 0\n")).gpu_experts, "0");
}

TEST(TrainConfigTest, HarmlessKeysAreAcceptedAndIgnored) {
  const std::string yaml =
      kMinimal + std::string(
                     "trust_remote_code: true\nflash_attn: fa2\n"
                     "preprocessing_num_workers: 16\noverwrite_cache: true\n"
                     "report_to: none\ndataloader_num_workers: 4\nuse_unsloth: false\n"
                     "fp16: false\ndeepspeed: null\nquantization_bit:\n"
                     "kt_cpu_activation: retain\n");
  TrainConfig expected = parse(kMinimal);
  EXPECT_EQ(parse(yaml), expected);
}

// ddp_timeout bounds every wait of a distributed job (seconds); LLaMA-Factory's default parses.
TEST(TrainConfigTest, DdpTimeoutIsReadAndLeavesTheFingerprintAlone) {
  EXPECT_EQ(parse(kMinimal).ddp_timeout, 1800);
  const TrainConfig lf = parse(kMinimal + std::string("ddp_timeout: 180000000\n"));
  EXPECT_EQ(lf.ddp_timeout, 180000000);
  EXPECT_EQ(configFingerprint(lf), configFingerprint(parse(kMinimal)));
  EXPECT_THROW(parse(kMinimal + std::string("ddp_timeout: 0\n")), Error);
}

// experts_mode: auto's keys: read, written only when set (so older configs keep their text),
// outside the fingerprint (any split gives the same numbers).
TEST(TrainConfigTest, ExpertSplitKeys) {
  const TrainConfig auto_mode =
      parse(kMinimal +
            std::string("experts_mode: auto\nexpert_split: cycle\nresident_refresh_steps: 5\n"));
  EXPECT_EQ(auto_mode.experts_mode, "auto");
  EXPECT_EQ(auto_mode.expert_split, "cycle");
  EXPECT_EQ(auto_mode.resident_refresh_steps, 5);
  EXPECT_EQ(parseTrainConfig(toYaml(auto_mode), "canonical.yaml", {}), auto_mode);
  EXPECT_EQ(toYaml(parse(kMinimal)).find("expert_split"), std::string::npos);
  EXPECT_EQ(configFingerprint(auto_mode), configFingerprint(parse(kMinimal)));
  EXPECT_THROW(parse(kMinimal + std::string("expert_split: greedy\n")), Error);
  EXPECT_THROW(parse(kMinimal + std::string("resident_refresh_steps: -1\n")), Error);
}

struct BadConfig {
  std::string lines;  // appended to kMinimal (or the whole text when `whole`)
  std::string error;  // expected to occur in Error::message()
  bool whole = false;
  std::vector<std::string> overrides = {};
};

TEST(TrainConfigTest, BadConfigsFailWithUsefulErrors) {
  const std::vector<BadConfig> cases = {
      {"learning_rat: 1.0e-4\n",
       "cfg.yaml:4: unknown key 'learning_rat' \u2014 did you mean 'learning_rate'?"},
      {"lora_rnak: 8\n", "unknown key 'lora_rnak' \u2014 did you mean 'lora_rank'?"},
      {"kt_config:\n  kt_bakend: AMXBF16\n",
       "unknown key 'kt_config.kt_bakend' \u2014 did you mean 'kt_config.kt_backend'?"},
      {"lora_rank: eight\n", "cfg.yaml:4: lora_rank must be a positive integer, got 'eight'"},
      {"lora_rank: 0\n", "lora_rank must be a positive integer, got '0'"},
      {"per_device_train_batch_size: 1.5\n",
       "per_device_train_batch_size must be a positive integer, got '1.5'"},
      {"learning_rate: -1\n", "learning_rate must be a positive number, got '-1'"},
      {"lr_scheduler_type: cosin\n",
       "lr_scheduler_type must be one of linear, cosine, constant, constant_with_warmup; got "
       "'cosin'"},
      {"warmup_ratio: 1\n", "warmup_ratio must be a number in [0, 1), got '1'"},
      {"val_size: -0.1\n", "val_size must be a number >= 0, got '-0.1'"},
      {"val_size: 2.5\n", "val_size must be a fraction in [0, 1) or a whole number of samples"},
      {"bf16: maybe\n", "bf16 must be true or false, got 'maybe'"},
      {"max_steps: 0\n",
       "max_steps must be -1 (use num_train_epochs) or a positive integer, got '0'"},
      {"device: gpu\n", "device must be auto, cpu, cuda or cuda:N; got 'gpu'"},
      {"experts_mode: gpu\n", "experts_mode must be auto, cpu or gpu-offload, got 'gpu'"},
      {"optim: sgd\n", "optim must be one of adamw_torch, adamw_torch_fused, adamw_hf; got 'sgd'"},
      {"finetuning_type: full\n", "'full' is not supported: Tandem trains LoRA adapters"},
      {"finetuning_type: freeze\n", "'freeze' is not supported: Tandem trains LoRA adapters"},
      {"stage: dpo\n", "'dpo' is not supported: Tandem does supervised fine-tuning only"},
      {"do_train: false\n", "do_train is false"},
      {"fp16: true\n",
       "fp16 is not supported by Tandem: Tandem trains in bf16 or fp32; use bf16: true"},
      {"deepspeed: examples/deepspeed/ds_z3_config.json\n", "deepspeed is not supported by Tandem"},
      {"quantization_bit: 4\n", "quantization_bit is not supported by Tandem: QLoRA"},
      {"use_unsloth: true\n", "use_unsloth is not supported by Tandem"},
      {"neftune_noise_alpha: 5\n", "neftune_noise_alpha is not supported by Tandem"},
      {"rope_scaling: linear\n", "rope_scaling is not supported by Tandem"},
      {"report_to: wandb\n", "report_to 'wandb' is not supported"},
      {"kt_backend: AMXINT4\n", "'AMXINT4' is a KTransformers backend Tandem does not have"},
      {"kt_backend: AMXBF16\nexperts_backend: generic\n",
       "experts_backend ('generic') conflicts with kt_backend ('AMXBF16', cfg.yaml:4)"},
      {"kt_config:\n  kt_expert_weight_format: mxfp4\n",
       "kt_config.kt_expert_weight_format 'mxfp4' is a KTransformers expert format Tandem does not "
       "have"},
      {"experts_format: fp16\n",
       "experts_format must be one of auto, bf16, int8, int4, fp8, blocks; got 'fp16'"},
      {"experts_fromat: int8\n",
       "unknown key 'experts_fromat' \u2014 did you mean 'experts_format'?"},
      {"experts_wt_policy: pool\n",
       "experts_wt_policy must be one of auto, persistent, on_demand, background; got 'pool'"},
      {"kt_backend: AMXInt8\nexperts_format: bf16\n",
       "experts_format ('bf16') cannot be computed by experts_backend amx_int8, which multiplies "
       "int8 weights only"},
      {"kt_backend: AMXInt8\nexperts_format: fp8\n",
       "experts_format ('fp8') cannot be computed by experts_backend amx_int8"},
      {"experts_backend: amx_bf16\nkt_config:\n  kt_expert_weight_format: int8\n",
       "kt_config.kt_expert_weight_format ('int8') cannot be computed by experts_backend amx_bf16, "
       "which "
       "multiplies bf16 weights only"},
      {"experts_format: int8\nkt_config:\n  kt_expert_weight_format: fp8\n",
       "kt_config.kt_expert_weight_format ('fp8') conflicts with experts_format ('int8', "
       "cfg.yaml:4)"},
      {"kt_config:\n  kt_num_gpu_experts: many\n", "kt_num_gpu_experts must be"},
      {"gpu_experts: -2\n", "gpu_experts must be"},
      {"kt_config:\n  kt_lora_rank: 16\n",
       "kt_config.kt_lora_rank (16) differs from lora_rank (8)"},
      {"use_kt: false\ncpu_infer: 32\n",
       "cpu_infer is a KTransformers setting, but use_kt is false"},
      {"val_size: 0.1\neval_dataset: alpaca_en_demo\n",
       "val_size cannot be combined with eval_dataset"},
      {"mask_history: true\ntrain_on_prompt: true\n",
       "mask_history is incompatible with train_on_prompt"},
      {"eval_strategy: steps\n", "eval_strategy asks for evaluation but there is no eval data"},
      {"lora_target: all,q_proj\n", "lora_target mixes 'all' with module names"},
      {"adapter_name_or_path: a,b\n", "adapter_name_or_path lists several adapters"},
      {"lora_rank: 8\nlora_rank: 16\n", "cfg.yaml:5: key 'lora_rank' appears twice"},
      {"lora_rank: [8\n", "cfg.yaml:5: not valid YAML"},
      {"dataset: identity\noutput_dir: x\n", "cfg.yaml: model_name_or_path is missing (required)",
       true},
      {"model_name_or_path: m\noutput_dir: x\n", "cfg.yaml: dataset is missing (required)", true},
      {"model_name_or_path: m\ndataset: d\n", "cfg.yaml: output_dir is missing (required)", true},
      {"",
       "command-line override 'lora_rank=eight': lora_rank must be a positive integer, got 'eight'",
       false,
       {"lora_rank=eight"}},
      {"",
       "command-line override 'learning_rat=1e-4': unknown key 'learning_rat' \u2014 did you "
       "mean 'learning_rate'?",
       false,
       {"learning_rat=1e-4"}},
      {"", "an override must look like key=value", false, {"learning_rate"}},
  };
  ASSERT_GE(cases.size(), 15u);
  for (const BadConfig& k : cases) {
    const std::string yaml = k.whole ? k.lines : kMinimal + k.lines;
    try {
      parse(yaml, k.overrides);
      ADD_FAILURE() << "no error for:\n" << yaml;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(k.error), std::string::npos)
          << "expected: " << k.error << "\n     got: " << e.message();
      EXPECT_FALSE(e.whatToDo().empty()) << e.message();
    }
  }
}

// Every numeric key has a range; the message names the key, the value and the range.
TEST(TrainConfigTest, NumbersOutOfRangeAreRefusedNamingKeyValueAndRange) {
  const std::vector<BadConfig> cases = {
      {"num_train_epochs: 1e300\n",
       "num_train_epochs must be a positive number up to 1000000, got '1e300'"},
      {"learning_rate: 1e6\n", "learning_rate must be a positive number up to 10, got '1e6'"},
      {"per_device_train_batch_size: 1e9\n",
       "per_device_train_batch_size must be a positive integer up to 65536, got '1e9'"},
      {"gradient_accumulation_steps: 9999999\n",
       "gradient_accumulation_steps must be a positive integer up to 65536"},
      {"max_steps: 1e13\n", "max_steps must be -1 or a positive integer up to 1000000000000"},
      {"cutoff_len: 100000000\n", "cutoff_len must be a positive integer up to 16777216"},
      {"warmup_steps: 1e14\n", "warmup_steps must be an integer in [0, 1000000000000]"},
      {"lora_rank: 100000\n", "lora_rank must be a positive integer up to 65536"},
      {"lora_alpha: 1e7\n", "lora_alpha must be a positive integer up to 65536"},
      {"lora_dropout: 1.5\n", "lora_dropout must be a number in [0, 1)"},
      {"max_grad_norm: 1e300\n", "max_grad_norm must be a number in [0, 1000000]"},
      {"weight_decay: 1e9\n", "weight_decay must be a number in [0, 1000]"},
      {"adam_epsilon: 5\n", "adam_epsilon must be a positive number up to 1"},
      {"save_steps: 1e15\n", "save_steps must be a positive integer up to 1000000000000"},
      {"seed: 1e12\n", "seed must be an integer in [0, 4294967295]"},
      {"loss_chunk_tokens: 1e9\n", "loss_chunk_tokens must be a positive integer up to 16777216"},
      {"num_train_epochs: .nan\n", "num_train_epochs must be a positive number"},
      {"gpu_experts: 9000000000\n", "gpu_experts must be auto or a count in [0, 1048576]"},
      {"learning_rate: .inf\n", "learning_rate must be a positive number"},
  };
  for (const BadConfig& c : cases) {
    try {
      parse(std::string(kMinimal) + c.lines);
      ADD_FAILURE() << "accepted: " << c.lines;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(c.error), std::string::npos) << c.lines << " -> " << e.message();
    }
  }
}

TEST(TrainConfigTest, ToYamlRoundTrips) {
  TrainConfig custom = parse(kMinimal);
  custom.adapter_name_or_path = "saves/previous";
  custom.template_name = "qwen3";
  custom.enable_thinking = false;
  custom.lora_rank = 16;
  custom.lora_alpha = 7;
  custom.lora_dropout = 0.05;
  custom.lora_target = {"q_proj", "v_proj"};
  custom.use_rslora = true;
  custom.dataset = {"a", "b"};
  custom.eval_dataset = {"c"};
  custom.dataset_dir = "my data: v2";  // needs quoting
  custom.cutoff_len = 4096;
  custom.max_samples = 10;
  custom.train_on_prompt = true;
  custom.packing = true;
  custom.per_device_train_batch_size = 2;
  custom.learning_rate = 3e-5;
  custom.num_train_epochs = 1.5;
  custom.max_steps = 1000;
  custom.lr_scheduler_type = LrSchedulerType::ConstantWithWarmup;
  custom.warmup_steps = 20;
  custom.max_grad_norm = 0.0;
  custom.weight_decay = 0.01;
  custom.adam_beta2 = 0.95;
  custom.adam_epsilon = 1e-6;
  custom.seed = 7;
  custom.gradient_checkpointing = false;
  custom.eval_strategy = EvalStrategy::Steps;
  custom.eval_steps = 50;
  custom.save_total_limit = 3;
  custom.resume = ResumeFrom::Path;
  custom.resume_path = "saves/run/checkpoint-200";
  custom.experts_backend = "amx_int8";
  custom.expert_threads = 30;
  custom.placement_rule = "rules/x.yaml";
  custom.expert_weight_path = "/weights/int8";
  custom.device = "cuda:1";
  custom.layer_devices = "cuda:0:0-13,cuda:1:14-27";
  custom.experts_mode = "gpu-offload";
  custom.loss_chunk_tokens = 512;
  custom.experts_format = "int8";
  custom.experts_wt_policy = "on_demand";
  TrainConfig latest = parse(kMinimal);
  latest.resume = ResumeFrom::Latest;

  for (const TrainConfig& original :
       {parse(kQwen3LoraSft), parse(kDeepseek3LoraSftKt), parse(kMinimal), custom, latest}) {
    const std::string yaml = toYaml(original);
    EXPECT_EQ(parseTrainConfig(yaml, "canonical.yaml", {}), original) << yaml;
    EXPECT_EQ(toYaml(parseTrainConfig(yaml, "canonical.yaml", {})), yaml);
  }
  // Floats are written so PyYAML (LLaMA-Factory) reads floats, not strings.
  const std::string yaml = toYaml(parse(kQwen3LoraSft));
  EXPECT_NE(yaml.find("learning_rate: 1.0e-04\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("num_train_epochs: 3.0\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("adam_epsilon: 1.0e-08\n"), std::string::npos) << yaml;
}

TEST(TrainConfigTest, FingerprintFollowsTheTrainingResult) {
  const TrainConfig base = parse(kQwen3LoraSft);
  const std::string fp = configFingerprint(base);
  EXPECT_EQ(fp.size(), 16u);
  EXPECT_EQ(configFingerprint(parse(kQwen3LoraSft)), fp);
  for (const char* changed : {"learning_rate=2e-4", "lora_rank=16", "seed=1", "dataset=other",
                              "cutoff_len=1024", "experts_backend=amx_int8"}) {
    EXPECT_NE(configFingerprint(parse(kQwen3LoraSft, {changed})), fp) << changed;
  }
  for (const char* same :
       {"logging_steps=1", "save_steps=10", "output_dir=elsewhere", "overwrite_output_dir=false",
        "save_total_limit=2", "resume_from_checkpoint=true", "plot_loss=false", "report_to=none",
        "cpu_infer=8", "ddp_timeout=10", "disable_gradient_checkpointing=true", "device=cpu",
        "layer_devices=cpu:0-47", "experts_mode=gpu-offload", "loss_chunk_tokens=256",
        "expert_chunk_tokens=512", "gpu_experts=4", "experts_wt_policy=on_demand"}) {
    EXPECT_EQ(configFingerprint(parse(kQwen3LoraSft, {same})), fp) << same;
  }
}

// LoRA experts (issue 32): auto or a count, le_dim; off by default and then absent from the
// canonical YAML, so runs without LE keep their fingerprints.
TEST(TrainConfigTest, LoraExpertsKeys) {
  EXPECT_EQ(parse(kMinimal).lora_experts, "0");
  EXPECT_EQ(parse(kMinimal).le_dim, 64);
  EXPECT_EQ(parse(kMinimal, {"lora_experts=AUTO"}).lora_experts, "auto");
  const TrainConfig c = parse(kMinimal + std::string("lora_experts: 3\nle_dim: 32\n"));
  EXPECT_EQ(c.lora_experts, "3");
  EXPECT_EQ(c.le_dim, 32);
  EXPECT_EQ(parseTrainConfig(toYaml(c), "round trip").lora_experts, "3");
  EXPECT_EQ(toYaml(parse(kMinimal)).find("lora_experts"), std::string::npos);
  EXPECT_EQ(configFingerprint(parse(kMinimal, {"lora_experts=0"})),
            configFingerprint(parse(kMinimal)));
  EXPECT_NE(configFingerprint(parse(kMinimal, {"lora_experts=2"})),
            configFingerprint(parse(kMinimal)));
  EXPECT_NE(configFingerprint(parse(kMinimal, {"lora_experts=2", "le_dim=8"})),
            configFingerprint(parse(kMinimal, {"lora_experts=2"})));
  for (const char* bad : {"lora_experts=65", "lora_experts=-1", "lora_experts=many", "le_dim=0"}) {
    try {
      parse(kMinimal, {bad});
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(bad).substr(0, std::string(bad).find('='))),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(TrainConfigTest, NeatPackingKey) {
  EXPECT_FALSE(parse(kMinimal).neat_packing);
  // LLaMA-Factory's DataArguments: neat_packing forces packing, even against packing: false.
  const TrainConfig c = parse(kMinimal, {"neat_packing=true", "packing=false"});
  EXPECT_TRUE(c.neat_packing);
  EXPECT_TRUE(c.packing);
  EXPECT_TRUE(parseTrainConfig(toYaml(c), "round trip").neat_packing);
  EXPECT_EQ(toYaml(parse(kMinimal)).find("neat_packing"), std::string::npos);
  EXPECT_EQ(configFingerprint(parse(kMinimal, {"neat_packing=false"})),
            configFingerprint(parse(kMinimal)));
  EXPECT_NE(configFingerprint(parse(kMinimal, {"neat_packing=true"})),
            configFingerprint(parse(kMinimal, {"packing=true"})));
  for (const char* key : {"neat_packing=true", "packing=true"}) {
    try {
      parse(kMinimal, {key, "cutoff_len=1"});
      ADD_FAILURE() << key << " with cutoff_len 1 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("needs cutoff_len >= 2"), std::string::npos) << e.what();
    }
  }
}

TEST(TrainConfigTest, LoadsFromAFileAndNamesItInErrors) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "tandem_train_config_test";
  std::filesystem::create_directories(dir);
  const std::filesystem::path path = dir / "qwen3_lora_sft.yaml";
  {
    std::ofstream out(path);
    out << kQwen3LoraSft;
  }
  EXPECT_EQ(loadTrainConfig(path, {"seed=3"}).seed, 3);
  {
    std::ofstream out(path, std::ios::app);
    out << "learning_rat: 1\n";
  }
  try {
    loadTrainConfig(path, {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(path.string() + ":46: unknown key 'learning_rat'"),
              std::string::npos)
        << e.message();
  }
  EXPECT_THROW(loadTrainConfig(dir / "missing.yaml", {}), Error);
  std::filesystem::remove_all(dir);
}

// Issue 29's long-sequence keys: parsed, round-tripped, left out of the fingerprint (the same
// math), and written only when set so earlier configs keep their text and fingerprint.
TEST(TrainConfig, LongContextKeys) {
  const TrainConfig plain = parse(kMinimal);
  EXPECT_FALSE(plain.offload_checkpoints);
  EXPECT_EQ(plain.moe_token_chunk, 0);
  EXPECT_EQ(toYaml(plain).find("offload_checkpoints"), std::string::npos);
  EXPECT_EQ(toYaml(plain).find("moe_token_chunk"), std::string::npos);
  const TrainConfig set =
      parse(std::string(kMinimal) + "offload_checkpoints: true\nmoe_token_chunk: 4096\n");
  EXPECT_TRUE(set.offload_checkpoints);
  EXPECT_EQ(set.moe_token_chunk, 4096);
  EXPECT_EQ(parseTrainConfig(toYaml(set), "round trip", {}), set);
  EXPECT_EQ(configFingerprint(set), configFingerprint(plain));
  EXPECT_EQ(parse(kMinimal, {"moe_token_chunk=1000"}).moe_token_chunk, 1000);
  for (const char* bad :
       {"moe_token_chunk: -1\n", "moe_token_chunk: 1e9\n", "offload_checkpoints: maybe\n"}) {
    EXPECT_THROW(parse(std::string(kMinimal) + bad), Error) << bad;
  }
}

}  // namespace
}  // namespace tandem::train
