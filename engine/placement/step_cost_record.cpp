#include "engine/placement/step_cost_record.h"

#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/placement/calibration_cache.h"

namespace tandem::placement {

namespace {

using nlohmann::json;

const json& field(const json& in, const char* name, const std::string& where) {
  if (!in.is_object() || !in.contains(name))
    throw Error("the cost-model record " + where + " has no \"" + name + "\"",
                "record it with a current tandem_e2e_bench (its JSON's cost_model.record)");
  return in.at(name);
}

}  // namespace

std::string stepCostRecordToJson(const StepCostRecord& record, const std::string& config_json) {
  const StepCostRequest& r = record.request;
  const json request = {{"tokens", r.tokens},
                        {"training", r.training},
                        {"gradient_checkpointing", r.gradient_checkpointing},
                        {"keep_expert_forward", r.keep_expert_forward},
                        {"weight_format", r.weight_format},
                        {"bf16", r.bf16},
                        {"resident_experts", r.resident_experts},
                        {"expert_lora_parameters", r.expert_lora_parameters},
                        {"gpu", r.gpu},
                        {"split_streamed_experts", r.split_streamed_experts}};
  const json out = {{"config", json::parse(config_json)},
                    {"request", request},
                    {"rates", json::parse(machineRatesToJson(record.rates))},
                    {"tokens_per_expert", record.routing.tokens_per_expert}};
  return out.dump();
}

StepCostRecord stepCostRecordFromJson(const std::string& json_text) {
  StepCostRecord record;
  try {
    const json in = json::parse(json_text);
    record.request.model = io::parseModelConfig(field(in, "config", "").dump(), "recorded config");
    const json& r = field(in, "request", "");
    StepCostRequest& q = record.request;
    q.tokens = field(r, "tokens", "request").get<int64_t>();
    q.training = field(r, "training", "request").get<bool>();
    q.gradient_checkpointing = field(r, "gradient_checkpointing", "request").get<bool>();
    q.keep_expert_forward = field(r, "keep_expert_forward", "request").get<bool>();
    q.weight_format = field(r, "weight_format", "request").get<std::string>();
    q.bf16 = field(r, "bf16", "request").get<bool>();
    q.resident_experts = field(r, "resident_experts", "request").get<int64_t>();
    q.expert_lora_parameters = field(r, "expert_lora_parameters", "request").get<int64_t>();
    q.gpu = field(r, "gpu", "request").get<int>();
    q.split_streamed_experts = r.value("split_streamed_experts", int64_t{-1});
    std::optional<MachineRates> rates = machineRatesFromJson(field(in, "rates", "").dump());
    if (!rates)
      throw Error("the cost-model record's rates are not usable (a bad or missing field)",
                  "record them again with a current tandem_e2e_bench");
    record.rates = std::move(*rates);
    record.routing.tokens_per_expert =
        field(in, "tokens_per_expert", "").get<std::vector<std::vector<int64_t>>>();
  } catch (const json::exception& e) {
    throw Error(std::string("the cost-model record is not valid: ") + e.what(),
                "record it with a current tandem_e2e_bench (its JSON's cost_model.record)");
  }
  return record;
}

std::string predictedModeOf(const std::string& run) {
  if (run == "tandem_co") return "co";
  if (run == "tandem_resident") return "resident";
  if (run == "tandem_offload" || run == "tandem_offload_int4") return "offload";
  if (run == "tandem_offload_resident") return "offload-resident";
  if (run == "tandem_auto") return "split";
  return "";
}

std::vector<RecordedRun> readRecordedRuns(const std::string& json_text) {
  json in;
  try {
    in = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(std::string("the e2e bench result is not JSON: ") + e.what(),
                "give the JSON file bench/e2e_train_bench.py wrote (--out)");
  }
  std::vector<RecordedRun> runs;
  if (!in.is_object()) return runs;
  for (const auto& [model, results] : in.items()) {
    if (!results.is_object()) continue;
    for (const auto& [run, result] : results.items()) {
      const std::string mode = predictedModeOf(run);
      if (mode.empty() || !result.is_object() || result.contains("error")) continue;
      const json* record = nullptr;
      if (result.contains("cost_model") && result["cost_model"].is_object() &&
          result["cost_model"].contains("record"))
        record = &result["cost_model"]["record"];
      if (!record || !result.contains("tokens_per_s")) continue;
      runs.push_back({model, run, mode, result["tokens_per_s"].get<double>(),
                      stepCostRecordFromJson(record->dump())});
    }
  }
  return runs;
}

ModePrediction predictRecorded(const RecordedRun& run) {
  const StepPrediction p = predictStep(run.record.request, run.record.rates, run.record.routing);
  const ModePrediction* mode = p.mode(run.predicted_mode);
  if (!mode || !mode->available)
    throw Error("the cost model has no " + run.predicted_mode + " prediction for " + run.model +
                    " " + run.run + (mode ? ": " + mode->why_not : std::string()),
                "check the record's rates (a GPU's terms) and resident experts");
  return *mode;
}

}  // namespace tandem::placement
