#pragma once
// The calibration's cache: MachineRates measured once per machine and kept as JSON in the user's
// cache directory (cacheDir()/calibration/<key hash>.json), so start-up costs a file read after
// the first run. The key names everything the rates depend on: the CPU model and core count, the
// GPUs, the torch and CUDA versions, and Tandem's version; when any of them changes the file no
// longer matches and the caller measures again. A file that is missing, unreadable, corrupt, of
// another key or with impossible rates is "no cache" (nullopt), never an error: re-measuring
// always fixes it. Writes are atomic (temp file + rename).

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/placement/machine_rates.h"

namespace tandem::placement {

struct CalibrationKey {
  std::string cpu_model;
  int cpu_cores = 0;
  std::vector<std::string> gpu_names;  // by index
  std::string torch_version;
  std::string cuda_version;  // "" without CUDA
  std::string tandem_version;
  // What was measured: the shapes of the synthetic layer (H, I) the rates are for.
  int64_t hidden = 0, intermediate = 0;
  int expert_lora_rank = 0;  // LoRA on the experts (0: none), which the engine's rate includes

  std::string text() const;  // one line naming every field: stored in the file and hashed
  bool operator==(const CalibrationKey&) const = default;
};

std::string machineRatesToJson(const MachineRates& rates, const CalibrationKey& key);
// The rates alone (the cache's fields without its key), as the e2e bench records them beside a
// run (step_cost_record.h); nullopt when the text holds no usable rates.
std::string machineRatesToJson(const MachineRates& rates);
std::optional<MachineRates> machineRatesFromJson(const std::string& json_text);
// nullopt when `json_text` is not a calibration of `key` with usable rates.
std::optional<MachineRates> machineRatesFromJson(const std::string& json_text,
                                                 const CalibrationKey& key);

// cacheDir()/calibration/<hash of key.text()>.json
std::filesystem::path calibrationCachePath(const CalibrationKey& key,
                                           const std::filesystem::path& cache_dir);
std::optional<MachineRates> readCalibrationCache(const CalibrationKey& key,
                                                 const std::filesystem::path& cache_dir);
void writeCalibrationCache(const MachineRates& rates, const CalibrationKey& key,
                           const std::filesystem::path& cache_dir);

}  // namespace tandem::placement
