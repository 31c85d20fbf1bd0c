#include "engine/model/peft_adapter_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"

namespace tandem::model {
namespace {

using Json = nlohmann::json;

// What Tandem's writePeftAdapter writes for a fused adapter (abridged).
Json writtenConfig() {
  return Json::parse(R"({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8,
    "lora_alpha": 16.0, "lora_dropout": 0.05, "use_rslora": false, "bias": "none",
    "target_modules": ["q_proj"], "rank_pattern": {"mlp.experts.gate_up_proj": 16},
    "alpha_pattern": {"mlp.experts.gate_up_proj": 32.0}, "use_dora": false,
    "modules_to_save": null, "peft_version": "0.21.0"})");
}

std::string configError(const std::string& text) {
  try {
    parsePeftAdapterConfig(text, "adapter_config.json");
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

TEST(PeftAdapterConfig, ReadsWhatTandemWrites) {
  const PeftAdapterConfig c = parsePeftAdapterConfig(writtenConfig().dump(), "adapter_config.json");
  EXPECT_EQ(c.rank, 8);
  EXPECT_EQ(c.alpha, 16.0);
  EXPECT_EQ(c.dropout, 0.05);
  EXPECT_FALSE(c.rslora);
  EXPECT_EQ(c.peft_version, "0.21.0");
  EXPECT_EQ(c.alphaFor("mlp.experts.gate_up_proj"), 32.0);
  EXPECT_EQ(c.alphaFor("mlp.experts.down_proj"), 16.0);
  // Nulls are absent, as in PEFT: the defaults r = 8, lora_alpha = 8.
  const PeftAdapterConfig d =
      parsePeftAdapterConfig(R"({"r": null, "peft_type": null})", "adapter_config.json");
  EXPECT_EQ(d.rank, 8);
  EXPECT_EQ(d.alpha, 8.0);
}

TEST(PeftAdapterConfig, HostileFieldsGiveAnErrorNamingTheField) {
  auto with = [](const char* key, Json value) {
    Json c = writtenConfig();
    c[key] = std::move(value);
    return c.dump();
  };
  // Before: nlohmann type_error out of value() ("internal error, please report this").
  EXPECT_NE(configError(with("peft_type", 3)).find("'peft_type'"), std::string::npos);
  EXPECT_NE(configError(with("use_dora", "yes")).find("'use_dora'"), std::string::npos);
  EXPECT_NE(configError(with("peft_version", Json::array())).find("'peft_version'"),
            std::string::npos);
  EXPECT_NE(
      configError(with("alpha_pattern", {{"mlp.experts.down_proj", "x"}})).find("alpha_pattern"),
      std::string::npos);
  // Before: static_cast<int>(1e300), undefined.
  EXPECT_NE(configError(with("r", 1e300)).find("'r'"), std::string::npos);
  EXPECT_NE(configError(with("r", 0)).find("'r'"), std::string::npos);
  EXPECT_NE(configError(with("r", 2.5)).find("'r'"), std::string::npos);
  EXPECT_NE(configError(with("use_dora", true)).find("DoRA"), std::string::npos);
  EXPECT_NE(configError(with("bias", "all")).find("bias"), std::string::npos);
  EXPECT_NE(configError("[1, 2]").find("object"), std::string::npos);
  // A quoted value is an excerpt; a value nested 100k deep is refused at parse.
  EXPECT_LT(configError(with("peft_type", std::string(100000, 'x'))).size(), 1000u);
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_NE(configError(R"({"peft_type": )" + deep + "}").find("nested more than"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::model
