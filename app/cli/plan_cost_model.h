#pragma once
// `tandem plan`'s cost-model block (issue 28): predicted tokens/s per experts mode (co, resident,
// offload, offload-resident) and for the per-expert split, with each resource's busy time, from
// this machine's calibrated rates (engine/model/cost_calibration.h: the cache, or measured with
// --calibrate; before the first calibration, the figures derived from its specs) or, for a
// hardware preset, the rates derived from the preset's specs. Kept out of
// plan_command.cpp so the plan printing there stays one call.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/io/model_config.h"
#include "engine/placement/hardware.h"
#include "engine/placement/memory_planner.h"
#include "engine/placement/step_cost.h"

namespace tandem::cli {

struct PlanCostModel {
  placement::StepCostRequest request;
  placement::StepPrediction prediction;
  std::string mode;          // the plan's own experts mode (plannedMode: auto's is "split")
  std::string rates_source;  // "calibrated", "cache", "preset ... (derived from specs)"
  std::vector<std::string> rate_notes;
};

// nullopt for a dense model (no routed experts) or when no CPU expert rate is known (the reason
// is in `why_not`). `probed`: the hardware is this machine (calibrate / read the cache), else a
// preset (presetRates). `calibrate`: measure again even when the cache matches.
std::optional<PlanCostModel> planCostModel(const placement::PlanRequest& request,
                                           const placement::MemoryPlan& plan,
                                           const placement::Hardware& hardware, bool probed,
                                           bool calibrate, std::string* why_not);

void printCostModel(const PlanCostModel& cost);

// `tandem doctor --calibrate`: measures this machine's rates again at an expert shape (H, I) and
// prints them (and the cache file they went to).
void printCalibration(int64_t hidden, int64_t intermediate);
nlohmann::json costModelJson(const PlanCostModel& cost);

}  // namespace tandem::cli
