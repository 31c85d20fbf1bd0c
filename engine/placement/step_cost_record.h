#pragma once
// What a cost-model prediction needs, recorded beside what a run measured (the e2e bench writes
// it under each mode's "cost_model": {"record": ...}), so a prediction can be recomputed later
// with the current model on a machine without the device the run was on: the model's
// config.json (at the depth built), the StepCostRequest, the machine's MachineRates as the run
// calibrated them, and the routing (pairs per expert per MoE layer). The GPU's fitted terms
// (GpuRates::expert_overhead_ms and the others) are the cost model's, not the machine's: they
// are not recorded, a recomputation uses the current ones.
//
// `tandem_e2e_bench --predict-from RESULT.json` prints each recorded mode's prediction against its
// measured tokens/s; engine/placement/recorded_runs_test.cpp holds the model to the H200 runs
// checked in under bench/results.

#include <string>
#include <vector>

#include "engine/placement/machine_rates.h"
#include "engine/placement/step_cost.h"

namespace tandem::placement {

struct StepCostRecord {
  StepCostRequest request;
  MachineRates rates;
  StepRouting routing;
};

// JSON text of `record`; config_json: the model's config.json text with num_hidden_layers as
// built (the request's ModelConfig is what the reader parses back from it).
std::string stepCostRecordToJson(const StepCostRecord& record, const std::string& config_json);
// Throws tandem::Error naming the missing or bad field.
StepCostRecord stepCostRecordFromJson(const std::string& json_text);

// One Tandem mode of an e2e bench result (bench/e2e_train_bench.py's JSON: {model: {"tandem_co":
// {...}, ...}}) that carries a record.
struct RecordedRun {
  std::string model;           // "v2-lite"
  std::string run;             // "tandem_co", "tandem_auto", ...
  std::string predicted_mode;  // the cost model's name for it: "co", ..., auto's "split"
  double measured_tokens_per_s = 0;
  StepCostRecord record;
};

// The cost model's mode for an e2e bench set-up ("tandem_auto" -> "split"); "" for others.
std::string predictedModeOf(const std::string& run);

// Every run of `json_text` with a record (runs without one, or with an error, are skipped).
// Throws tandem::Error when the text is not JSON or a record is unreadable.
std::vector<RecordedRun> readRecordedRuns(const std::string& json_text);

// The run's mode predicted by the current model.
ModePrediction predictRecorded(const RecordedRun& run);

}  // namespace tandem::placement
