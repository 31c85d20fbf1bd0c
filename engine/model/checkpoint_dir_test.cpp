#include "engine/model/checkpoint_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace tandem::model {
namespace {

TEST(CheckpointDirs, OnlyCheckpointDashDigitsCount) {
  EXPECT_EQ(checkpointStep("out/checkpoint-40"), 40);
  EXPECT_EQ(checkpointStep("checkpoint-0"), 0);
  EXPECT_FALSE(checkpointStep("checkpoint-").has_value());
  EXPECT_FALSE(checkpointStep("checkpoint-best").has_value());
  EXPECT_FALSE(checkpointStep("checkpoint-12a").has_value());
  EXPECT_FALSE(checkpointStep(".checkpoint-8.tmp-123").has_value());
  EXPECT_FALSE(checkpointStep("checkpoint-99999999999999999999999").has_value());
}

TEST(CheckpointDirs, LastCompleteOneWins) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir / "checkpoint-10");
  std::ofstream(dir / "checkpoint-10" / "trainer_state.json") << "{}";
  fs::create_directories(dir / "checkpoint-20");  // incomplete: no trainer_state.json
  fs::create_directories(dir / "checkpoint-best");
  std::ofstream(dir / "checkpoint-best" / "trainer_state.json") << "{}";
  EXPECT_EQ(lastCheckpoint(dir), dir / "checkpoint-10");
  EXPECT_TRUE(lastCheckpoint(dir / "missing").empty());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::model
