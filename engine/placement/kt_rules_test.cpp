#include "engine/placement/kt_rules.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/io/model_config.h"

namespace tandem::placement {
namespace {

const std::filesystem::path kModels = std::filesystem::path(TANDEM_PRESETS_DIR) / "models";
const std::filesystem::path kLlamaFactoryRule =
    std::filesystem::path(TANDEM_PLACEMENT_TESTDATA) / "DeepSeek-V3-Chat-sft-amx-multi-gpu.yaml";

io::ModelConfig model(const char* name) { return io::readModelConfig(kModels / name); }

std::string errorOf(const std::string& yaml, const io::ModelConfig& m) {
  try {
    applyKtRules(parseKtRules(yaml, "rules.yaml"), m);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

const ModulePlacement& at(const Placement& p, const std::string& name) {
  const ModulePlacement* m = p.find(name);
  if (!m) throw std::runtime_error("no module " + name);
  return *m;
}

// LLaMA-Factory's DeepSeek-V3 two-GPU AMX rule file, read as KTransformers would apply it.
TEST(KtRules, ReadsLlamaFactoryDeepSeekV3MultiGpu) {
  const io::ModelConfig v3 = model("deepseek-v3.json");
  const KtRuleFile rules = loadKtRules(kLlamaFactoryRule);
  ASSERT_EQ(rules.rules.size(), 17u);
  EXPECT_EQ(rules.rules[9].recursive, false);
  const Placement p = applyKtRules(rules, v3);
  EXPECT_EQ(at(p, "model.embed_tokens").device.str(), "cpu");
  for (int layer : {0, 2, 29}) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    EXPECT_EQ(at(p, prefix + "self_attn").device.str(), "cuda:0") << layer;
  }
  EXPECT_EQ(at(p, "model.layers.0.mlp").device.str(),
            "cuda:0");  // dense layer: the catch-all default rule
  EXPECT_EQ(at(p, "model.layers.3.mlp.gate").device.str(), "cuda:0");
  EXPECT_EQ(at(p, "model.layers.3.mlp.shared_experts").device.str(), "cuda:0");
  for (int layer : {30, 45, 60}) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    EXPECT_EQ(at(p, prefix + "self_attn").device.str(), "cuda:1") << layer;
    EXPECT_EQ(at(p, prefix + "mlp.gate").device.str(), "cuda:1") << layer;
    EXPECT_EQ(at(p, prefix + "mlp.shared_experts").device.str(), "cuda:1")
        << layer;  // the last rule
  }
  const ModulePlacement& experts = at(p, "model.layers.40.mlp.experts");
  EXPECT_EQ(experts.device.str(), "cpu");
  EXPECT_EQ(experts.backend, "amx_int8");
  EXPECT_EQ(experts.weight_format, "int8");
  EXPECT_EQ(at(p, "model.norm").device.str(), "cuda:1");
  EXPECT_EQ(at(p, "lm_head").device.str(), "cuda:1");
  const RuntimePlacement runtime = toRuntimePlacement(p);
  EXPECT_EQ(runtime.layer_devices.size(), 61u);
  EXPECT_EQ(runtime.layer_devices[29].str(), "cuda:0");
  EXPECT_EQ(runtime.layer_devices[30].str(), "cuda:1");
  EXPECT_EQ(runtime.experts_mode, "cpu");
  EXPECT_EQ(runtime.experts_backend, "amx_int8");
}

TEST(KtRules, LlamaFactoryFileRoundTrips) {
  const io::ModelConfig v3 = model("deepseek-v3.json");
  const Placement first = applyKtRules(loadKtRules(kLlamaFactoryRule), v3);
  const std::string written = writeKtRules(first, v3);
  const Placement second = applyKtRules(parseKtRules(written, "written.yaml"), v3);
  EXPECT_EQ(first, second) << written;
  EXPECT_EQ(writeKtRules(second, v3), written);  // and the writer is deterministic
}

TEST(KtRules, TandemOnlyChoicesRoundTrip) {
  const io::ModelConfig qwen = model("qwen3-30b-a3b.json");
  Placement p = applyKtRules(
      parseKtRules("- match: {name: \"^model\\\\.layers\\\\..*\\\\.mlp\\\\.experts$\"}\n"
                   "  replace: {class: KTransformersExperts, kwargs: {generate_device: cpu}}\n",
                   "r.yaml"),
      qwen);
  for (ModulePlacement& m : p.modules) {
    if (m.kind != ModuleKind::RoutedExperts) continue;
    m.device = Device::numaNode(m.layer < 24 ? 0 : 1);
    m.backend = m.layer % 2 ? "avx512_bf16" : "gpu-offload";
    m.compute_device = m.layer % 2 ? std::nullopt : std::optional(Device::cuda(0));
    if (m.backend == "gpu-offload") m.device = Device::cpu();
    m.weight_format = "fp8";
  }
  const Placement again = applyKtRules(parseKtRules(writeKtRules(p, qwen), "w.yaml"), qwen);
  EXPECT_EQ(p, again);
}

TEST(KtRules, MixtralNamesItsBlockSparseMoe) {
  const io::ModelConfig mixtral = model("mixtral-8x7b.json");
  // LLaMA-Factory's Mixtral.yaml, abridged: the experts rule and the catch-all.
  const Placement p = applyKtRules(parseKtRules(R"(
- match:
    name: "^model\\.layers\\..*\\.block_sparse_moe\\.experts$"
  replace:
    class: ktransformers.operators.experts.KTransformersExperts
    kwargs: {prefill_device: "cuda", generate_device: "cpu", out_device: "cuda"}
  recursive: False
- match:
    name: "^model\\.layers\\..*\\."
  replace:
    class: "default"
    kwargs: {generate_device: "cuda", prefill_device: "cuda"}
)",
                                                "mixtral.yaml"),
                                   mixtral);
  EXPECT_EQ(at(p, "model.layers.5.mlp.experts").backend, "auto");
  EXPECT_EQ(at(p, "model.layers.5.mlp.experts").device.str(), "cpu");
  EXPECT_EQ(at(p, "model.layers.5.mlp.gate").device.str(), "cuda:0");
  const Placement again = applyKtRules(parseKtRules(writeKtRules(p, mixtral), "w.yaml"), mixtral);
  EXPECT_EQ(p, again);
}

TEST(KtRules, FirstMatchWins) {
  const io::ModelConfig qwen = model("qwen3-30b-a3b.json");
  const Placement p = applyKtRules(parseKtRules(R"(
- match: {name: "^model\\.layers\\.1\\.self_attn$"}
  replace: {class: default, kwargs: {prefill_device: "cuda:1"}}
- match: {name: "^model\\.layers\\.\\d+\\.self_attn$"}
  replace: {class: default, kwargs: {prefill_device: "cuda:2"}}
- match: {name: "^model\\.layers\\.1\\.self_attn$"}
  replace: {class: default, kwargs: {prefill_device: "cuda:3"}}
- match: {name: "layers"}
  replace: {class: default, kwargs: {prefill_device: "cuda:4"}}
)",
                                                "r.yaml"),
                                   qwen);
  EXPECT_EQ(at(p, "model.layers.1.self_attn").device.str(), "cuda:1");
  EXPECT_EQ(at(p, "model.layers.0.self_attn").device.str(), "cuda:2");
  // re.match anchors at the start: "layers" does not match "model.layers...", so KT's default.
  EXPECT_EQ(at(p, "model.layers.0.mlp.gate").device.str(), "cuda:0");
  // A class in match narrows it: the router of qwen3_moe is a torch.nn.Linear.
  const Placement q = applyKtRules(parseKtRules(R"(
- match: {name: "^model\\.layers\\.0\\.", class: torch.nn.Linear}
  replace: {class: default, kwargs: {prefill_device: "cuda:5"}}
- match: {name: "^model\\.layers\\.0\\."}
  replace: {class: default, kwargs: {prefill_device: "cuda:6"}}
)",
                                                "r.yaml"),
                                   qwen);
  EXPECT_EQ(at(q, "model.layers.0.mlp.gate").device.str(), "cuda:5");
  EXPECT_EQ(at(q, "model.layers.0.self_attn").device.str(), "cuda:6");
}

TEST(KtRules, ErrorsNameTheRuleAndTheModule) {
  const io::ModelConfig qwen = model("qwen3-30b-a3b.json");
  EXPECT_EQ(errorOf("- match: {name: \"^model\\\\.layers\\\\.3\\\\.mlp\\\\.experts$\"}\n"
                    "  replace: {class: KTransformersExperts, kwargs: {backend: AMXInt4}}\n",
                    qwen),
            "rules.yaml: rule 1 (name ^model\\.layers\\.3\\.mlp\\.experts$) for "
            "model.layers.3.mlp.experts: "
            "backend 'AMXInt4' is not one Tandem has");
  EXPECT_EQ(errorOf("- match: {name: \"^model\\\\.norm\"}\n  replace: {class: default}\n"
                    "- match: {name: \"^model\\\\.layers\\\\.7\\\\.self_attn$\"}\n"
                    "  replace: {class: KFancyAttention}\n",
                    qwen),
            "rules.yaml: rule 2 (name ^model\\.layers\\.7\\.self_attn$) for "
            "model.layers.7.self_attn: replace class "
            "'KFancyAttention' is not one Tandem knows for attention");
  EXPECT_EQ(errorOf("- match: {name: \"^lm_head$\"}\n  replace: {class: default, kwargs: "
                    "{prefill_device: tpu}}\n",
                    qwen),
            "rules.yaml: rule 1 (name ^lm_head$) for lm_head: device: 'tpu' is not a device");
  EXPECT_EQ(
      errorOf("- match: {name: \"^lm_head$\"}\n  replace: {class: default, kwargs: {speed: max}}\n",
              qwen),
      "rules.yaml: rule 1 (name ^lm_head$) for lm_head: kwarg 'speed' is not one Tandem knows");
  EXPECT_EQ(
      errorOf("- match: {name: \"(unclosed\"}\n  replace: {class: default}\n", qwen).substr(0, 67),
      "rules.yaml: rule 1: match.name '(unclosed' is not a valid regex (at");
  EXPECT_EQ(errorOf("- match: {name: x}\n", qwen),
            "rules.yaml: rule 1: replace is missing or not a block of class/kwargs");
  EXPECT_EQ(errorOf("- match: {nmae: x}\n  replace: {class: default}\n", qwen),
            "rules.yaml: rule 1: match: unknown key 'nmae'");
  EXPECT_EQ(errorOf("match: x\n", qwen),
            "rules.yaml: a rule file is a list of `- match: ... replace: ...` rules");
  // A rule for modules Tandem does not have (rotary embeddings) is fine whatever its class.
  EXPECT_EQ(
      errorOf("- match: {class: ktransformers.models.modeling_qwen3_moe.Qwen3MoeRotaryEmbedding}\n"
              "  replace: {class: ktransformers.operators.RoPE.RotaryEmbedding}\n",
              qwen),
      "");
}

// Values of the wrong YAML kind threw yaml-cpp's TypedBadConversion out of the reader
// ("internal error, please report this"); each is now an Error naming the rule and the key.
TEST(KtRules, NonScalarValuesAreErrorsNamingTheKey) {
  const io::ModelConfig qwen = model("qwen3-30b-a3b.json");
  EXPECT_EQ(errorOf("- match: {name: [1, 2]}\n  replace: {class: default}\n", qwen),
            "rules.yaml: rule 1: match.name must be a text value, not a list");
  EXPECT_EQ(errorOf("- match: {class: {a: b}}\n  replace: {class: default}\n", qwen),
            "rules.yaml: rule 1: match.class must be a text value, not a block");
  EXPECT_EQ(errorOf("- match: {name: x}\n  replace: {class: [a]}\n", qwen),
            "rules.yaml: rule 1: replace.class must be a text value, not a list");
  EXPECT_EQ(errorOf("- match: {name: x}\n  replace: {class: default, kwargs: {[a]: b}}\n", qwen),
            "rules.yaml: rule 1: replace.kwargs has a key that is not a text value");
  EXPECT_EQ(errorOf("- {[a]: b}\n", qwen), "rules.yaml: rule 1 has a key that is not a text value");
  EXPECT_EQ(errorOf("- match: {{a: b}: x}\n  replace: {class: default}\n", qwen),
            "rules.yaml: rule 1: match has a key that is not a text value");
  // A kwarg Tandem reads must be a text value too; a list where a device goes is not one.
  EXPECT_EQ(errorOf("- match: {name: \"^lm_head$\"}\n"
                    "  replace: {class: default, kwargs: {prefill_device: [cuda:0]}}\n",
                    qwen),
            "rules.yaml: rule 1 (name ^lm_head$) for lm_head: kwarg prefill_device must be a text "
            "value, not a list");
  // Nested past yaml-cpp's depth guard: a parse error, not a stack overflow.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_NE(errorOf("- match: {name: " + deep + "}\n", qwen).find("not valid YAML"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::placement
