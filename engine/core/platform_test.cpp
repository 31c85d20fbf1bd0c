// The platform layer (engine/core/platform) on whichever OS this runs: the Linux build tests the
// *_linux.cpp files, the mingw build under wine the *_windows.cpp ones (scripts/windows_cross.sh).

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/platform/aligned_memory.h"
#include "engine/core/platform/cpu_affinity.h"
#include "engine/core/platform/cpu_topology.h"
#include "engine/core/platform/durable_file.h"
#include "engine/core/platform/environment.h"
#include "engine/core/platform/file_lock.h"
#include "engine/core/platform/local_time.h"
#include "engine/core/platform/numa_memory.h"
#include "engine/core/platform/numa_nodes.h"
#include "engine/core/platform/process_info.h"
#include "engine/core/platform/system_memory.h"
#include "engine/core/platform/thread_priority.h"
#include "engine/core/platform/user_dirs.h"

namespace tandem::platform {
namespace {

namespace fs = std::filesystem;

class PlatformFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem_platform_" + std::to_string(currentProcessId()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path dir_;
};

TEST_F(PlatformFiles, NewFileIsExclusiveAndReplacesTheTarget) {
  const fs::path temp = dir_ / "a.tmp";
  const fs::path target = dir_ / "a.txt";
  std::ofstream(target) << "old";
  std::error_code error;
  std::FILE* file = createNewFileForWriting(temp, error);
  ASSERT_NE(file, nullptr) << error.message();
  EXPECT_EQ(createNewFileForWriting(temp, error), nullptr);  // already there
  EXPECT_EQ(error, std::errc::file_exists) << error.message();
  std::fputs("new", file);
  EXPECT_FALSE(flushFileToDisk(file));
  std::fclose(file);
  EXPECT_FALSE(replaceFile(temp, target));
  EXPECT_FALSE(flushDirectoryToDisk(dir_));
  EXPECT_EQ(read(target), "new");
  EXPECT_FALSE(fs::exists(temp));
}

TEST_F(PlatformFiles, MissingDirectoryReadsAsNoSuchFile) {
  std::error_code error;
  EXPECT_EQ(createNewFileForWriting(dir_ / "missing" / "a", error), nullptr);
  EXPECT_EQ(error, std::errc::no_such_file_or_directory) << error.message();
  EXPECT_FALSE(isDiskFull(error));
  EXPECT_TRUE(isDiskFull(std::make_error_code(std::errc::no_space_on_device)));
}

TEST_F(PlatformFiles, AppendAddsWholeLines) {
  const fs::path log = dir_ / "log.jsonl";
  EXPECT_FALSE(appendInOneWrite(log, "one\n"));
  EXPECT_FALSE(appendInOneWrite(log, "two\n"));
  EXPECT_EQ(read(log), "one\ntwo\n");
}

// One holder at a time (another handle in this same process is turned away too), its note
// readable while it holds the lock, and the lock free again once the holder is gone.
TEST_F(PlatformFiles, FileLockHasOneHolderWhoseNoteStaysReadable) {
  const fs::path file = dir_ / "run.lock";
  std::error_code error;
  {
    std::optional<FileLock> held = FileLock::tryAcquire(file, error);
    ASSERT_TRUE(held) << error.message();
    EXPECT_FALSE(held->writeNote("{\"pid\": 7}\n"));
    EXPECT_FALSE(FileLock::tryAcquire(file, error));
    EXPECT_FALSE(error) << error.message();  // held, which is not a failure
    EXPECT_EQ(read(file), "{\"pid\": 7}\n");
    EXPECT_FALSE(held->writeNote("2"));  // a shorter note replaces the whole text
    EXPECT_EQ(read(file), "2");
    FileLock moved = std::move(*held);
    held.reset();  // the moved-from object releases nothing
    EXPECT_FALSE(FileLock::tryAcquire(file, error));
  }
  EXPECT_TRUE(FileLock::tryAcquire(file, error)) << error.message();
  EXPECT_FALSE(FileLock::tryAcquire(dir_ / "missing" / "run.lock", error));
  EXPECT_EQ(error, std::errc::no_such_file_or_directory) << error.message();
}

TEST(PlatformProcess, KnowsItselfAndItsMachine) {
  EXPECT_GT(currentProcessId(), 0);
  EXPECT_FALSE(processIsGone(currentProcessId()));
  EXPECT_FALSE(processIsGone(0));  // not a pid: never "gone"
  EXPECT_FALSE(hostName().empty());
  EXPECT_FALSE(currentUserTag().empty());
  const fs::path exe = executablePath();
  ASSERT_FALSE(exe.empty());
  EXPECT_TRUE(fs::exists(exe)) << exe;
  EXPECT_NE(exe.filename().string().find("core_platform_test"), std::string::npos) << exe;
}

TEST(PlatformEnvironment, SetAndUnsetAreSeenByGetenv) {
  ASSERT_TRUE(setEnvironmentVariable("TANDEM_PLATFORM_TEST", "42"));
  ASSERT_NE(std::getenv("TANDEM_PLATFORM_TEST"), nullptr);
  EXPECT_STREQ(std::getenv("TANDEM_PLATFORM_TEST"), "42");
  ASSERT_TRUE(unsetEnvironmentVariable("TANDEM_PLATFORM_TEST"));
  EXPECT_EQ(std::getenv("TANDEM_PLATFORM_TEST"), nullptr);
}

TEST(PlatformMachine, CpusCoresAndMemory) {
  const std::vector<int> cpus = allowedCpuIds();
  ASSERT_FALSE(cpus.empty());
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
  const CpuCoreCounts counts = cpuCoreCounts(cpus);
  EXPECT_GE(counts.sockets, 1);
  EXPECT_GE(counts.physical_cores, counts.sockets);
  EXPECT_LE(counts.physical_cores, static_cast<int>(cpus.size()));
  const SystemMemoryBytes memory = systemMemoryBytes();
  EXPECT_GT(memory.total_bytes, 0u);
  EXPECT_LE(memory.free_bytes, memory.total_bytes);
  EXPECT_FALSE(accountHomeDir().empty());
}

TEST(PlatformMachine, NumaNodesAndNodeMemory) {
  if (numaSupported()) {
    EXPECT_GE(numaHighestNodeId(), 0);
    bool any = false;
    for (int id = 0; id <= numaHighestNodeId(); ++id) any = any || numaNodeExists(id);
    EXPECT_TRUE(any);
  }
  // Node memory where the OS has it, nullptr where not; either way usable and freed.
  void* node_memory = allocateOnNumaNode(1 << 20, 0);
  if (node_memory != nullptr) {
    std::memset(node_memory, 1, 1 << 20);
    freeOnNumaNode(node_memory, 1 << 20);
  }
  EXPECT_EQ(allocateOnNumaNode(0, 0), nullptr);
  EXPECT_EQ(allocateOnNumaNode(4096, 1 << 20), nullptr);  // no such node
}

TEST(PlatformMemory, AlignedAllocationsAreAligned) {
  for (size_t bytes : {1u, 63u, 64u, 4097u}) {
    void* p = allocateAligned(bytes, 64);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    std::memset(p, 0, bytes);
    freeAligned(p);
  }
  freeAligned(nullptr);
}

TEST(PlatformTime, LocalCalendarTimeOfNow) {
  const std::tm local = localCalendarTime(std::time(nullptr));
  EXPECT_GE(local.tm_year, 120);  // 2020 or later
  EXPECT_GE(local.tm_mday, 1);
}

TEST(PlatformThreads, PinningAndPriority) {
  const std::vector<int> cpus = allowedCpuIds();
  ASSERT_FALSE(cpus.empty());
  std::atomic<bool> pinned{false}, lowered{false};
  std::thread([&] {
    pinned = pinCurrentThreadToCpu(cpus.front());
    lowered = lowerCurrentThreadPriority(5);
  }).join();
  EXPECT_TRUE(pinned);
  EXPECT_TRUE(lowered);
  EXPECT_FALSE(pinCurrentThreadToCpu(-1));
}

}  // namespace
}  // namespace tandem::platform
