// `tandem launch --nnodes N --node-rank K --master ADDR:PORT [--nproc-per-node P] -- train
// CONFIG.yaml`: torchrun without Python. Starts this node's P ranks of the job as child
// processes of this same binary with torchrun's environment (and LLaMA-Factory's), forwards
// Ctrl-C / SIGTERM to them once each, and exits with the first failing rank's status. The same
// happens for `tandem train` when LLaMA-Factory's FORCE_TORCHRUN=1 is set without RANK.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "app/cli/commands.h"
#include "engine/core/error.h"
#include "engine/core/platform/child_processes.h"
#include "engine/core/platform/interrupt.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/train/distributed_env.h"

namespace tandem::cli {

namespace {

std::atomic<int> g_interrupts{0};

void onInterrupt() { g_interrupts.fetch_add(1); }

// The environment of one rank: ours, less the variables the launcher sets, plus those. With a
// GPU for each local rank (and no CUDA_VISIBLE_DEVICES of the user's), rank k sees GPU k alone,
// as torchrun scripts' torch.cuda.set_device(LOCAL_RANK) does; with fewer GPUs than ranks, the
// ranks share them (the process group's log says so).
std::vector<std::string> rankEnvironment(const train::LaunchPlan& plan, int local_rank, int gpus) {
  auto overrides = plan.rankEnvironment(local_rank);
  if (plan.nproc_per_node > 1 && gpus >= plan.nproc_per_node &&
      !std::getenv("CUDA_VISIBLE_DEVICES")) {
    overrides.emplace_back("CUDA_VISIBLE_DEVICES", std::to_string(local_rank));
    overrides.emplace_back("TANDEM_GPU_PER_RANK", "1");  // for the process group's log line
  }
  std::vector<std::string> env;
  for (const std::string& entry : platform::processEnvironment()) {
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = name == "FORCE_TORCHRUN";  // the children are ranks, not launchers
    for (const auto& [key, value] : overrides) replaced = replaced || key == name;
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [key, value] : overrides) env.push_back(key + "=" + value);
  return env;
}

// The ranks get a process group of their own: a terminal's Ctrl-C reaches this launcher alone,
// which passes it on once (a second one would mean "cancel" to `tandem train`).
int64_t spawnRank(const train::LaunchPlan& plan, int local_rank, int gpus,
                  const std::vector<std::string>& command, int64_t group) {
  std::vector<std::string> args{"tandem"};
  args.insert(args.end(), command.begin(), command.end());
  return platform::spawnSelf(args, rankEnvironment(plan, local_rank, gpus), group,
                             "local rank " + std::to_string(local_rank));
}

}  // namespace

int launchRanks(const train::LaunchPlan& plan, const std::vector<std::string>& command) {
  plan.validate();
  if (command.empty() || command.front() != "train") {
    throw Error("tandem launch starts `train`: nothing else runs as ranks of a job",
                "tandem launch ... -- train CONFIG.yaml [key=value ...]");
  }
  const int first_rank = plan.node_rank * plan.nproc_per_node;
  std::fprintf(stderr, "launching ranks %d..%d of %d on this node (rendezvous %s:%d)\n", first_rank,
               first_rank + plan.nproc_per_node - 1, plan.nnodes * plan.nproc_per_node,
               plan.master_addr.c_str(), plan.master_port);
  platform::ScopedInterruptHandler interrupt(onInterrupt,
                                             platform::InterruptKinds::CtrlCAndTerminate);
  const int gpus =
      plan.nproc_per_node > 1 ? static_cast<int>(gpu::probeTorchRuntime().gpus.size()) : 0;
  std::vector<int64_t> children;
  for (int local = 0; local < plan.nproc_per_node; ++local) {
    children.push_back(
        spawnRank(plan, local, gpus, command, children.empty() ? 0 : children.front()));
  }
  std::optional<int> failure;  // the first failing rank's exit code
  size_t running = children.size();
  int forwarded = 0;
  auto failed_at = std::chrono::steady_clock::time_point();
  bool terminated = false;
  while (running > 0) {
    const int seen = g_interrupts.load();
    if (seen > forwarded) {  // each Ctrl-C / SIGTERM once to every rank still running
      forwarded = seen;
      for (int64_t child : children)
        if (child > 0) platform::interruptProcess(child);
    }
    if (const std::optional<platform::ChildExit> done = platform::reapEndedChild()) {
      for (size_t local = 0; local < children.size(); ++local) {
        if (children[local] != done->pid) continue;
        children[local] = -1;
        --running;
        if (done->exit_code != 0 && !failure) {
          failure = done->exit_code;
          failed_at = std::chrono::steady_clock::now();
          std::fprintf(stderr, "rank %d (local rank %zu) exited with status %d\n",
                       first_rank + static_cast<int>(local), local, done->exit_code);
        }
      }
      continue;
    }
    // The others see a failed peer at their next exchange and stop with a message naming it;
    // ranks still running 30 s later (waiting on a peer on another node) are ended.
    if (failure && !terminated &&
        std::chrono::steady_clock::now() - failed_at > std::chrono::seconds(30)) {
      terminated = true;
      for (int64_t child : children)
        if (child > 0) platform::killProcess(child);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return failure.value_or(0);
}

std::optional<int> launchIfForced(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "train") return std::nullopt;
  const std::optional<train::LaunchPlan> plan = train::launchPlanFromEnvironment(std::getenv);
  if (!plan) return std::nullopt;
  return launchRanks(*plan, std::vector<std::string>(argv + 1, argv + argc));
}

void addLaunchCommand(CLI::App& app) {
  auto* command = app.add_subcommand(
      "launch", "Start this node's ranks of a data-parallel training job (like torchrun)");
  auto plan = std::make_shared<train::LaunchPlan>();
  auto master = std::make_shared<std::string>("127.0.0.1:29500");
  auto rest = std::make_shared<std::vector<std::string>>();
  command->add_option("--nnodes", plan->nnodes, "nodes in the job")->capture_default_str();
  command
      ->add_option("--node-rank", plan->node_rank, "this node's rank (node 0 hosts the rendezvous)")
      ->capture_default_str();
  command->add_option("--nproc-per-node", plan->nproc_per_node, "ranks to start on this node")
      ->capture_default_str();
  command
      ->add_option("--master", *master,
                   "ADDR:PORT of the rendezvous on node 0; it listens on ADDR only")
      ->capture_default_str();
  command->add_option("command", *rest, "-- train CONFIG.yaml [key=value ...]")->required();
  command->callback([plan, master, rest] {
    std::tie(plan->master_addr, plan->master_port) = train::parseMasterEndpoint(*master);
    const int code = launchRanks(*plan, *rest);
    if (code != 0) std::exit(code);
  });
}

}  // namespace tandem::cli
