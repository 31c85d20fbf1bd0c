// `tandem train CONFIG.yaml [key=value ...]`: a LLaMA-Factory-style LoRA fine-tune. The job runs
// on its own thread; this one prints progress and turns Ctrl-C into "stop with a checkpoint"
// (a second Ctrl-C cancels without one).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app/cli/commands.h"
#include "app/cli/loss_plot.h"
#include "app/cli/train_progress.h"
#include "engine/core/error.h"
#include "engine/core/platform/interrupt.h"
#include "engine/store/run_store.h"
#include "engine/train/train_config.h"
#include "engine/train/training_run.h"

namespace tandem::cli {

namespace {

std::atomic<int> g_interrupts{0};

void onInterrupt() { g_interrupts.fetch_add(1); }

}  // namespace

train::TrainingRunOutcome runTrainingInForeground(const train::TrainConfig& config,
                                                  store::RunStore* store, bool quiet) {
  ProgressPrinter printer(quiet);
  std::stop_source stop, cancel;
  std::exception_ptr error;
  train::TrainingRunOutcome outcome;
  std::atomic<bool> done{false};
  std::optional<platform::ScopedInterruptHandler> interrupt;
  interrupt.emplace(onInterrupt, platform::InterruptKinds::CtrlCAndTerminate);
  std::jthread job([&] {
    try {
      outcome = train::runTraining(config, printer, {stop.get_token(), cancel.get_token()}, store);
    } catch (...) {
      error = std::current_exception();
    }
    done.store(true);
  });
  int handled = 0;
  while (!done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int interrupts = g_interrupts.load();
    if (interrupts > handled) {
      handled = interrupts;
      if (handled == 1) {
        std::fprintf(
            stderr,
            "\nstopping at the end of this step (with a checkpoint); Ctrl-C again to cancel\n");
        stop.request_stop();
      } else {
        cancel.request_stop();
      }
    }
  }
  job.join();
  interrupt.reset();
  printer.finish();
  if (error) std::rethrow_exception(error);
  return outcome;
}

void plotIfAsked(const train::TrainConfig& config) {
  if (!config.plot_loss) return;
  // A rank of a data-parallel job other than 0 wrote no log to plot (rank 0 plots it).
  if (const char* rank = std::getenv("RANK"); rank && *rank && std::string(rank) != "0") return;
  if (writeLossPlot(config.output_dir)) {
    std::printf("loss curve: %s\n", (config.output_dir / "training_loss.png").string().c_str());
  } else {
    std::printf("plot_loss: this build has no Qt Charts; no training_loss.png written\n");
  }
}

void addTrainCommand(CLI::App& app) {
  auto* command =
      app.add_subcommand("train", "Fine-tune with LoRA from a LLaMA-Factory-style YAML config");
  auto config_path = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  auto db = std::make_shared<std::string>();
  command->add_option("config", *config_path, "training YAML (LLaMA-Factory keys)")->required();
  command->add_option("overrides", *overrides, "key=value settings that replace the file's");
  command->add_option("--db", *db,
                      "run store (default: $TANDEM_HOME/runs.db or ~/.local/share/tandem/runs.db)");
  // Long sequences (docs/long_context.md): spellings of the keys, applied after the overrides.
  auto offload_checkpoints = std::make_shared<bool>(false);
  auto moe_token_chunk = std::make_shared<std::optional<int64_t>>();
  command->add_flag("--offload-checkpoints", *offload_checkpoints,
                    "offload_checkpoints=true: checkpoints in host memory (implies checkpointing)");
  command->add_option("--moe-token-chunk", *moe_token_chunk,
                      "moe_token_chunk=N: tokens per MoE chunk (0 = auto)");
  command->callback([config_path, overrides, db, offload_checkpoints, moe_token_chunk] {
    std::vector<std::string> settings = *overrides;
    if (*offload_checkpoints) settings.push_back("offload_checkpoints=true");
    if (*moe_token_chunk)
      settings.push_back("moe_token_chunk=" + std::to_string(**moe_token_chunk));
    const train::TrainConfig config = train::loadTrainConfig(*config_path, settings);
    store::RunStore store = store::RunStore::open(db->empty() ? store::RunStore::defaultPath()
                                                              : std::filesystem::path(*db));
    const train::TrainingRunOutcome outcome =
        runTrainingInForeground(config, &store, /*quiet=*/false);
    if (outcome.result.outcome == TrainOutcome::Cancelled) throw Error("training cancelled");
    plotIfAsked(config);
  });
}

}  // namespace tandem::cli
