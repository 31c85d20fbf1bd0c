#include "app/cli/train_progress.h"

#include <cstdio>

#include "engine/core/platform/terminal.h"
#include "engine/core/units.h"

namespace tandem::cli {

ProgressPrinter::ProgressPrinter(bool quiet) : quiet_(quiet), tty_(platform::stdoutIsTerminal()) {}

void ProgressPrinter::onStep(const StepEvent& e) {
  if (quiet_) return;
  std::lock_guard lock(mutex_);
  const int width = 24;
  const int filled = static_cast<int>(width * e.step / std::max<int64_t>(1, e.total_steps));
  const std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
  std::printf(
      "%s[%s] step %lld/%lld  loss %.4f  lr %.2e  grad %.3f  %.0f tok/s  %s elapsed  ETA %s%s",
      tty_ ? "\r" : "", bar.c_str(), static_cast<long long>(e.step),
      static_cast<long long>(e.total_steps), e.loss, e.learning_rate, e.grad_norm, e.tokens_per_s,
      formatDuration(e.elapsed_s).c_str(), formatDuration(e.eta_s).c_str(), tty_ ? "  " : "\n");
  line_open_ = tty_;
  std::fflush(stdout);
}

void ProgressPrinter::onCheckpoint(int64_t step, const std::filesystem::path& dir) {
  onMessage("checkpoint at step " + std::to_string(step) + ": " + dir.string());
}

void ProgressPrinter::onMessage(const std::string& message) {
  std::lock_guard lock(mutex_);
  if (line_open_) std::printf("\n");
  line_open_ = false;
  std::printf("%s\n", message.c_str());
  std::fflush(stdout);
}

void ProgressPrinter::finish() {
  std::lock_guard lock(mutex_);
  if (line_open_) std::printf("\n");
  line_open_ = false;
}

}  // namespace tandem::cli
