// The output dir's marker, lock and clean-up: Tandem clears only what its marker lists and only
// when nothing else is there; a second run is turned away with the holder's pid, and a killed
// holder's lock is gone with it; dead saves' temp dirs are swept.

#include "engine/train/output_dir.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <string>

#include "engine/core/error.h"
#include "engine/io/owned_dir.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;
using io::isListedArtefact;

fs::path freshDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_output_dir_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void touch(const fs::path& file, const std::string& text = "x") {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

std::string errorText(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message() + " | " + e.whatToDo();
  }
  return "";
}

TEST(OutputDir, AnEmptyMarkerIsNoCredential) {
  const fs::path dir = freshDir("empty_marker");
  touch(dir / kRunMarkerFile, "{}");
  touch(dir / "checkpoint-5" / "trainer_state.json", "{}");
  touch(dir / "my_thesis.tex");
  const std::optional<RunMarker> marker = readRunMarker(dir);
  ASSERT_TRUE(marker);
  EXPECT_FALSE(marker->ours);
  const std::string error = errorText([&] { clearOwnRun(dir); });
  EXPECT_NE(error.find("was not written by Tandem (checkpoint-5, my_thesis.tex, tandem_run.json;"),
            std::string::npos)
      << error;
  EXPECT_TRUE(fs::exists(dir / "my_thesis.tex"));
  EXPECT_TRUE(fs::exists(dir / "checkpoint-5"));
  fs::remove_all(dir);
}

TEST(OutputDir, ClearingRefusesAndListsWhatTandemDidNotWrite) {
  const fs::path dir = freshDir("foreign");
  writeRunMarker(dir, "abc", "lr: 1\n");
  touch(dir / "checkpoint-2" / "adapter_model.safetensors");
  touch(dir / "trainer_log.jsonl");
  touch(dir / "notes.txt");
  touch(dir / "earlier-run" / "adapter_model.safetensors");
  touch(dir / "checkpoint-best" / "x");  // looks alike, is not checkpoint-<N>
  const std::string error = errorText([&] { clearOwnRun(dir); });
  EXPECT_NE(error.find("checkpoint-best, earlier-run, notes.txt"), std::string::npos) << error;
  EXPECT_NE(error.find("move those out"), std::string::npos) << error;
  for (const char* kept : {"notes.txt", "earlier-run", "checkpoint-2", "trainer_log.jsonl"})
    EXPECT_TRUE(fs::exists(dir / kept)) << kept;
  fs::remove_all(dir);
}

TEST(OutputDir, ClearingRemovesOnlyTheRunsOwnArtefacts) {
  const fs::path dir = freshDir("own");
  writeRunMarker(dir, "abc", "lr: 1\n");
  const RunMarker marker = *readRunMarker(dir);
  EXPECT_TRUE(marker.ours);
  EXPECT_EQ(marker.config_fingerprint, "abc");
  touch(dir / "checkpoint-2" / "adapter_model.safetensors");
  touch(dir / ".checkpoint-3.tmp-77" / "optimizer.safetensors");
  for (const char* f : {"trainer_log.jsonl", "trainer_state.json", "adapter_config.json",
                        "adapter_model.safetensors", "training_loss.png", kRunLockFile})
    touch(dir / f);
  EXPECT_TRUE(foreignEntries(dir, marker).empty());
  clearOwnRun(dir);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{kRunLockFile});  // held by the caller, not removed
  fs::remove_all(dir);
}

// The marker older releases wrote (fingerprint and YAML) still marks their runs, cleared by the
// same rule; a look-alike without a real fingerprint does not.
TEST(OutputDir, AnEarlierReleasesMarkerStillCounts) {
  const fs::path dir = freshDir("legacy");
  touch(dir / kRunMarkerFile, R"({"config_fingerprint": "0123456789abcdef", "config": "a: 1"})");
  touch(dir / "checkpoint-1" / "trainer_state.json");
  const RunMarker marker = *readRunMarker(dir);
  EXPECT_TRUE(marker.ours);
  EXPECT_EQ(marker.config_fingerprint, "0123456789abcdef");
  clearOwnRun(dir);
  EXPECT_TRUE(fs::is_empty(dir));
  touch(dir / kRunMarkerFile, R"({"config_fingerprint": "x", "config": "a: 1"})");
  EXPECT_FALSE(readRunMarker(dir)->ours);
  fs::remove_all(dir);
}

TEST(OutputDir, ArtefactPatternsMatchDigitsOnly) {
  const std::vector<std::string> a = {"checkpoint-<N>", ".checkpoint-<N>.tmp-<pid>"};
  EXPECT_TRUE(isListedArtefact("checkpoint-12", a));
  EXPECT_TRUE(isListedArtefact(".checkpoint-12.tmp-4242", a));
  EXPECT_FALSE(isListedArtefact("checkpoint-", a));
  EXPECT_FALSE(isListedArtefact("checkpoint-12x", a));
  EXPECT_FALSE(isListedArtefact(".checkpoint-12.tmp-", a));
}

TEST(OutputDir, ASecondRunIsTurnedAwayWithTheHoldersPid) {
  const fs::path dir = freshDir("lock");
  {
    const platform::FileLock held = lockOutputDir(dir);
    const std::string error = errorText([&] { lockOutputDir(dir); });
    EXPECT_NE(error.find("is in use by another Tandem run (pid " + std::to_string(::getpid())),
              std::string::npos)
        << error;
    EXPECT_EQ(errorText([&] { refuseIfOutputDirBusy(dir); }), error);
  }
  EXPECT_NO_THROW(refuseIfOutputDirBusy(dir));  // the probe holds nothing after it
  EXPECT_NO_THROW(lockOutputDir(dir));          // released with the object
  fs::remove_all(dir);
}

TEST(OutputDir, AKilledHoldersLockDiesWithIt) {
  const fs::path dir = freshDir("killed");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const platform::FileLock held = lockOutputDir(dir);
    const char byte = 1;
    if (::write(ready[1], &byte, 1) != 1) ::_exit(2);
    ::pause();  // until SIGKILL
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  const std::string error = errorText([&] { lockOutputDir(dir); });
  EXPECT_NE(error.find("pid " + std::to_string(child)), std::string::npos) << error;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_NO_THROW(lockOutputDir(dir));
  ::close(ready[0]);
  ::close(ready[1]);
  fs::remove_all(dir);
}

TEST(OutputDir, TheEarlyCheckWritesNothing) {
  const fs::path dir = freshDir("probe") / "not_yet";
  EXPECT_NO_THROW(refuseIfOutputDirBusy(dir));
  EXPECT_FALSE(fs::exists(dir));
  fs::remove_all(dir.parent_path());
}

TEST(OutputDir, DeadSavesTempDirsAreSwept) {
  const fs::path dir = freshDir("sweep");
  touch(dir / ".checkpoint-4.tmp-999999" / "adapter_model.safetensors");
  touch(dir / (".checkpoint-8.tmp-" + std::to_string(::getpid())) / "x");
  touch(dir / "checkpoint-3" / "trainer_state.json");
  touch(dir / ".checkpoint-notes");
  EXPECT_EQ(sweepCheckpointTemps(dir), 2);
  EXPECT_TRUE(fs::exists(dir / "checkpoint-3" / "trainer_state.json"));
  EXPECT_TRUE(fs::exists(dir / ".checkpoint-notes"));
  EXPECT_FALSE(fs::exists(dir / ".checkpoint-4.tmp-999999"));
  fs::remove_all(dir);
}

TEST(OutputDir, AFreshRunSetsTheOldLogAside) {
  const fs::path dir = freshDir("log");
  touch(dir / "trainer_log.jsonl", "{\"current_steps\":1}\n");
  setAsidePreviousLog(dir);
  EXPECT_FALSE(fs::exists(dir / "trainer_log.jsonl"));
  EXPECT_TRUE(fs::exists(dir / kPreviousLogFile));
  setAsidePreviousLog(dir);  // nothing to move: fine
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::train
