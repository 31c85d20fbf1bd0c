#include "engine/train/distributed_env.h"

#include <gtest/gtest.h>

#include <map>

#include "engine/core/error.h"

namespace tandem::train {
namespace {

GetEnv fakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(DistributedEnv, TorchrunVariablesNameTheRank) {
  const auto env = rankEnvFromEnvironment(fakeEnv({{"RANK", "3"},
                                                   {"WORLD_SIZE", "4"},
                                                   {"LOCAL_RANK", "1"},
                                                   {"LOCAL_WORLD_SIZE", "2"},
                                                   {"MASTER_ADDR", "10.0.0.1"},
                                                   {"MASTER_PORT", "29555"}}));
  ASSERT_TRUE(env);
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 4);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 2);
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  EXPECT_EQ(env->master_port, 29555);
}

TEST(DistributedEnv, AloneWithoutVariablesOrWithOneRank) {
  EXPECT_FALSE(rankEnvFromEnvironment(fakeEnv({})));
  EXPECT_FALSE(rankEnvFromEnvironment(fakeEnv({{"RANK", "0"}, {"WORLD_SIZE", "1"}})));
}

TEST(DistributedEnv, HalfSetOrInconsistentVariablesAreErrors) {
  EXPECT_THROW(rankEnvFromEnvironment(fakeEnv({{"RANK", "0"}})), Error);
  EXPECT_THROW(rankEnvFromEnvironment(fakeEnv({{"WORLD_SIZE", "2"}})), Error);
  EXPECT_THROW(
      rankEnvFromEnvironment(fakeEnv({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})),
      Error);
  EXPECT_THROW(rankEnvFromEnvironment(fakeEnv({{"RANK", "0"}, {"WORLD_SIZE", "2"}})), Error);
  EXPECT_THROW(
      rankEnvFromEnvironment(fakeEnv({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})),
      Error);
}

TEST(DistributedEnv, ForceTorchrunMakesALaunchPlanWithLlamaFactoryDefaults) {
  EXPECT_FALSE(launchPlanFromEnvironment(fakeEnv({{"NNODES", "2"}})));
  const auto plan = launchPlanFromEnvironment(fakeEnv({{"FORCE_TORCHRUN", "1"},
                                                       {"NNODES", "2"},
                                                       {"NODE_RANK", "1"},
                                                       {"NPROC_PER_NODE", "2"},
                                                       {"MASTER_ADDR", "10.0.0.1"},
                                                       {"MASTER_PORT", "29600"}}));
  ASSERT_TRUE(plan);
  const auto env = plan->rankEnvironment(1);
  const std::map<std::string, std::string> vars(env.begin(), env.end());
  EXPECT_EQ(vars.at("RANK"), "3");  // node 1's second process
  EXPECT_EQ(vars.at("WORLD_SIZE"), "4");
  EXPECT_EQ(vars.at("LOCAL_RANK"), "1");
  EXPECT_EQ(vars.at("MASTER_ADDR"), "10.0.0.1");
  EXPECT_EQ(vars.at("MASTER_PORT"), "29600");
  // A rank already set: this process is one that a launcher started, not a launcher.
  EXPECT_FALSE(launchPlanFromEnvironment(fakeEnv({{"FORCE_TORCHRUN", "1"}, {"RANK", "0"}})));
  // Several nodes cannot meet on a loopback address.
  EXPECT_THROW(launchPlanFromEnvironment(fakeEnv({{"FORCE_TORCHRUN", "1"}, {"NNODES", "2"}})),
               Error);
}

TEST(DistributedEnv, MasterEndpointParses) {
  EXPECT_EQ(parseMasterEndpoint("10.0.0.1:29500"), std::make_pair(std::string("10.0.0.1"), 29500));
  EXPECT_EQ(parseMasterEndpoint("[fd00::1]:29501"), std::make_pair(std::string("fd00::1"), 29501));
  EXPECT_THROW(parseMasterEndpoint("10.0.0.1"), Error);
  EXPECT_THROW(parseMasterEndpoint(":29500"), Error);
  EXPECT_THROW(parseMasterEndpoint("host:70000"), Error);
}

}  // namespace
}  // namespace tandem::train
