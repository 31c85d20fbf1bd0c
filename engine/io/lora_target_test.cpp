#include "engine/io/lora_target.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace tandem::io {
namespace {

TEST(LoraTarget, AllTakesEveryLinearButRouterAndLmHead) {
  const LoraTarget t = LoraTarget::parse(" all ");
  EXPECT_TRUE(t.all());
  EXPECT_TRUE(t.matches("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(t.matches("model.layers.0.self_attn.kv_a_proj_with_mqa"));
  EXPECT_TRUE(t.matches("model.layers.1.mlp.shared_expert_gate"));
  EXPECT_TRUE(t.matches("model.layers.1.mlp.experts.down_proj"));
  EXPECT_FALSE(t.matches("model.layers.1.mlp.gate"));
  EXPECT_FALSE(t.matches("lm_head"));
  EXPECT_EQ(t.text(), "all");
}

TEST(LoraTarget, ListMatchesLeafNames) {
  const LoraTarget t = LoraTarget::parse("q_proj, v_proj,w1");
  EXPECT_TRUE(t.matches("model.layers.7.self_attn.q_proj"));
  EXPECT_TRUE(t.matches("model.layers.7.self_attn.v_proj"));
  EXPECT_FALSE(t.matches("model.layers.7.self_attn.k_proj"));
  EXPECT_TRUE(t.matches("model.layers.7.mlp.experts.gate_proj"));  // w1 = gate_proj
  EXPECT_TRUE(t.matches("model.layers.0.mlp.gate_proj"));
  EXPECT_EQ(t.text(), "gate_proj,q_proj,v_proj");
}

TEST(LoraTarget, BadListsAreErrors) {
  EXPECT_THROW(LoraTarget::parse(""), Error);
  EXPECT_THROW(LoraTarget::parse("q_proj,,v_proj"), Error);
  EXPECT_THROW(LoraTarget::parse("q_proj,"), Error);
  try {
    LoraTarget::parse("q_proj,qkv").checkAgainst({"q_proj", "k_proj", "v_proj", "o_proj"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("'qkv'"), std::string::npos);
    EXPECT_NE(e.whatToDo().find("o_proj"), std::string::npos);
  }
}

}  // namespace
}  // namespace tandem::io
