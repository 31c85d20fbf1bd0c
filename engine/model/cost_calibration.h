#pragma once
// The calibration behind the cost model (engine/placement/step_cost.h): measures this machine's
// rates in about a second and caches them per machine (placement/calibration_cache.h), so later
// runs read a file. Measured:
//   - the CPU expert engine, through the real ExpertLayer on a small synthetic layer of the
//     target's expert shape (H, I), bf16 weights (and int8 when asked), forward and backward at
//     1, 8, 64 and 512 tokens per expert (balanced routing, top-1);
//   - the host's memory stream (the fused CPU AdamW's bound) and libtorch's bf16 dense products
//     on the CPU (what a machine without a GPU runs its dense parts at);
//   - with a GPU: pinned host → device and device → host copy bandwidth, the GPU's bf16 expert
//     products ([tokens, H] × [H, I] shapes at the same tokens per expert) and a dense rate.
// Without a GPU the GPU terms are absent. The header is torch-free (the CLI includes it).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/placement/calibration_cache.h"
#include "engine/placement/machine_rates.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::model {

struct CalibrationOptions {
  int64_t hidden = 2048;  // the target's expert shape
  int64_t intermediate = 768;
  int expert_lora_rank = 0;  // LoRA on the experts, as the run will have it (0: none)
  std::vector<std::string> formats = {"bf16"};  // also "int8"
  bool force = false;                           // re-measure even when the cache matches
  // One timed repeat per point instead of 2-4 (after the same warm-up): what training start-up
  // measures when there is no cache, about half the time of the full calibration.
  bool quick = false;
  std::filesystem::path cache_dir;  // empty: cacheDir()
};

struct Calibration {
  placement::MachineRates rates;
  bool from_cache = false;
  double measured_s = 0;  // time spent measuring (0 from the cache)
  std::filesystem::path cache_file;
};

// This machine's key: CPU model and cores, GPU names, torch / CUDA / Tandem versions, the shape.
placement::CalibrationKey calibrationKey(const CalibrationOptions& options);

// The cached rates when the key matches and the file is sound (and !force), else measures and
// writes the cache (a cache that cannot be written is a warning in the notes, not an error).
Calibration calibrateMachine(const CalibrationOptions& options, ThreadPool& pool);

// experts_mode auto at training start-up: the cached rates, else measured now (quick) and
// cached; `log` gets a line before the measurement and one with its result, none from the cache.
Calibration calibrateAtStartup(CalibrationOptions options, ThreadPool& pool,
                               const std::function<void(const std::string&)>& log);

// The cached rates only (nullopt when the cache does not match or is unsound): for callers that
// must not spend the second measuring (`tandem plan` without --calibrate).
std::optional<placement::MachineRates> cachedCalibration(const CalibrationOptions& options);

}  // namespace tandem::model
