// `tandem plan CONFIG.yaml [--hardware PRESET|FILE] [--placement FILE] [--json] [--rules-out
// FILE]`: will this training config fit, where does every module go, and if it does not fit, what
// to change. Nothing is loaded: the model's config.json, the training YAML and the hardware
// (probed, or a preset from presets/hardware/) are all it reads.

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "app/cli/commands.h"
#include "app/cli/plan_cost_model.h"
#include "engine/core/error.h"
#include "engine/core/install_layout.h"
#include "engine/core/units.h"
#include "engine/io/atomic_file.h"
#include "engine/model/machine_probe.h"
#include "engine/placement/hardware.h"
#include "engine/placement/kt_rules.h"
#include "engine/placement/sequence_fit.h"
#include "engine/train/job_plan.h"
#include "engine/train/training_plan.h"

namespace tandem::cli {

namespace {

namespace fs = std::filesystem;
using placement::DevicePlan;
using placement::MemoryPlan;
using placement::ModuleKind;
using placement::ModulePlacement;
using placement::PlanCategory;

struct PlanOptions {
  std::string config;
  std::string hardware;  // "" = probe this machine
  std::string rules_out;
  std::string hardware_out;
  std::string placement;  // "" = the config's kt_optimize_rule, or the planner's own
  bool json = false;
  bool split_layers = false;
  bool calibrate = false;  // the cost model: measure this machine's rates again
  train::JobShape job;     // a data-parallel job: global batch and all-reduce per step
  int64_t chat_context =
      0;  // > 0: plan chatting with this many tokens of context instead of training
};

struct Summary {
  std::string what;
  int first = -1, last = -1;
  std::string where;
};

// Per module kind, consecutive layers with the same devices collapse into one line.
std::vector<Summary> summarize(const placement::Placement& p) {
  std::vector<Summary> lines;
  for (int k = 0; k < placement::kModuleKindCount; ++k) {
    const auto kind = static_cast<ModuleKind>(k);
    const size_t first_line = lines.size();
    for (const ModulePlacement& m : p.modules) {
      if (m.kind != kind) continue;
      std::string where = m.device.str();
      if (kind == ModuleKind::RoutedExperts) {
        where += ", " + m.backend + (m.compute_device ? " on " + m.compute_device->str() : "") +
                 ", " + m.weight_format;
        if (m.gpu_experts > 0)
          where += ", " + std::to_string(m.gpu_experts) + " resident on the layer's GPU";
      }
      Summary* last = lines.size() > first_line ? &lines.back() : nullptr;
      if (last && last->where == where && last->last >= 0 && m.layer >= 0) {
        last->last = m.layer;
      } else {
        lines.push_back({std::string(placement::moduleKindName(kind)), m.layer, m.layer, where});
      }
    }
  }
  return lines;
}

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

void printHuman(const MemoryPlan& plan, const train::TrainConfig& config,
                const io::ModelConfig& model, const placement::Hardware& hw, int64_t chat_context) {
  std::printf("model     %s (%s, %d layers", config.model_name_or_path.c_str(),
              model.model_type.c_str(), model.num_hidden_layers);
  if (model.isMoe())
    std::printf(", %d experts top-%d", model.num_experts, model.num_experts_per_tok);
  std::printf(")\nhardware  %s\n", hw.name.c_str());
  if (chat_context > 0) {
    std::printf("chat      %lld tokens of context, LoRA r=%lld adapter, %s\n\n",
                static_cast<long long>(chat_context), static_cast<long long>(config.lora_rank),
                config.bf16 ? "bf16" : "fp32");
  } else {
    std::printf(
        "training  LoRA r=%lld, cutoff_len %lld x batch %lld, gradient checkpointing %s, %s\n\n",
        static_cast<long long>(config.lora_rank), static_cast<long long>(config.cutoff_len),
        static_cast<long long>(config.per_device_train_batch_size),
        config.gradient_checkpointing ? "on" : "off", config.bf16 ? "bf16" : "fp32");
  }
  std::printf("%-11s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s  %s\n", "GiB", "capacity", "weights",
              "lora+opt", "activ.", "exp.cache", "packedWt", "kv", "staging", "overhead", "total",
              "");
  for (const DevicePlan& d : plan.devices) {
    std::printf("%-11s %9s", d.device.str().c_str(), gib(d.capacity_bytes).c_str());
    for (int c = 0; c < placement::kPlanCategoryCount; ++c)
      std::printf(" %9s", gib(d.bytes[static_cast<size_t>(c)]).c_str());
    std::printf(" %9s  %s\n", gib(d.total()).c_str(), d.fits() ? "ok" : "OVER");
  }
  std::printf("\nplacement\n");
  for (const Summary& s : summarize(plan.placement)) {
    std::string layers = s.first < 0 ? ""
                         : s.first == s.last
                             ? "layer " + std::to_string(s.first)
                             : "layers " + std::to_string(s.first) + "-" + std::to_string(s.last);
    std::printf("  %-15s %-14s %s\n", s.what.c_str(), layers.c_str(), s.where.c_str());
  }
  if (!plan.expert_formats.empty()) {
    std::printf("\nrouted experts held as   bits/weight   host GiB\n");
    for (const placement::ExpertFormatOption& f : plan.expert_formats) {
      std::printf("  %-22s %11.2f  %9s  %s%s\n", f.format.c_str(), f.bits_per_weight,
                  gib(f.host_bytes).c_str(), f.host_fits ? "fits" : "does not fit",
                  f.chosen ? "  <- this plan" : "");
    }
  }
  std::printf("\n%s\n", plan.fits ? "fits" : "does NOT fit");
  for (const std::string& p : plan.problems) std::printf("  %s\n", p.c_str());
  for (const std::string& a : plan.advice) std::printf("  advice: %s\n", a.c_str());
  for (const std::string& n : plan.notes) std::printf("  note: %s\n", n.c_str());
}

nlohmann::json toJson(const MemoryPlan& plan, const placement::Hardware& hw,
                      const io::ModelConfig& model) {
  nlohmann::json devices = nlohmann::json::array();
  for (const DevicePlan& d : plan.devices) {
    nlohmann::json bytes, items = nlohmann::json::array();
    for (int c = 0; c < placement::kPlanCategoryCount; ++c) {
      bytes[std::string(placement::planCategoryName(static_cast<PlanCategory>(c)))] =
          d.bytes[static_cast<size_t>(c)];
    }
    for (const placement::PlanItem& i : d.items) {
      items.push_back({{"what", i.what},
                       {"category", placement::planCategoryName(i.category)},
                       {"bytes", i.bytes}});
    }
    devices.push_back({{"device", d.device.str()},
                       {"capacity_bytes", d.capacity_bytes},
                       {"total_bytes", d.total()},
                       {"fits", d.fits()},
                       {"bytes", bytes},
                       {"items", items}});
  }
  nlohmann::json modules = nlohmann::json::array();
  for (const ModulePlacement& m : plan.placement.modules) {
    nlohmann::json j = {{"name", m.name},
                        {"kind", placement::moduleKindName(m.kind)},
                        {"layer", m.layer},
                        {"device", m.device.str()},
                        {"parameters", placement::moduleParameters(model, m)}};
    if (m.kind == ModuleKind::RoutedExperts) {
      j["backend"] = m.backend;
      j["weight_format"] = m.weight_format;
      if (m.compute_device) j["compute_device"] = m.compute_device->str();
      j["gpu_experts"] = m.gpu_experts;
    }
    modules.push_back(j);
  }
  nlohmann::json formats = nlohmann::json::array();
  for (const placement::ExpertFormatOption& f : plan.expert_formats) {
    formats.push_back({{"format", f.format},
                       {"bits_per_weight", f.bits_per_weight},
                       {"host_bytes", f.host_bytes},
                       {"host_fits", f.host_fits},
                       {"chosen", f.chosen}});
  }
  return {{"hardware", {{"name", hw.name}, {"source", hw.source}}},
          {"expert_formats", formats},
          {"expert_format_choice", plan.expert_format_choice},
          {"fits", plan.fits},
          {"devices", devices},
          {"placement", modules},
          {"transposed_weights", plan.transposed_weights},
          {"problems", plan.problems},
          {"advice", plan.advice},
          {"notes", plan.notes}};
}

// Issue 29: the predicted peaks at this cutoff_len and the longest that fits this plan's placement.
nlohmann::json sequenceFitJson(const placement::SequenceFit& fit) {
  return {{"cutoff_len", fit.cutoff_len},
          {"gpu_peak_bytes", fit.gpu_peak_bytes},
          {"gpu_peak_device", fit.gpu_peak_device},
          {"host_bytes", fit.host_bytes},
          {"longest_cutoff_len", fit.longest_cutoff_len},
          {"at_ceiling", fit.at_ceiling},
          {"longest_gpu_peak_bytes", fit.longest_gpu_peak_bytes},
          {"longest_host_bytes", fit.longest_host_bytes},
          {"lengthen", fit.lengthen}};
}

void printSequenceFit(const placement::SequenceFit& fit) {
  std::printf("\nsequence  %s\n", placement::sequenceFitLine(fit).c_str());
  for (const std::string& change : fit.lengthen) std::printf("  longer with %s\n", change.c_str());
}

void runPlan(const PlanOptions& o) {
  const train::TrainConfig config = train::loadTrainConfig(o.config);
  const io::ModelConfig model = io::readModelConfig(config.model_name_or_path);
  const fs::path presets = presetsDir() / "hardware";
  const placement::Hardware hw =
      o.hardware.empty() ? model::probeMachine() : placement::resolveHardware(o.hardware, presets);
  placement::PlanRequest request = train::planRequestFor(config, model);
  request.whole_layers = !o.split_layers;
  request.compare_expert_formats = model.isMoe();
  if (o.chat_context > 0) {
    request.training = false;
    request.kv_cache_tokens = o.chat_context;
    request.cutoff_len = o.chat_context;  // the prompt's prefill is the largest forward
  }
  const fs::path placement_file =
      o.placement.empty() ? config.placement_rule : fs::path(o.placement);
  MemoryPlan plan = placement_file.empty()
                        ? placement::planMemory(request, hw)
                        : placement::evaluatePlacement(
                              request, hw, placement::loadPlacementFile(placement_file, model));
  if (!o.rules_out.empty())
    io::writeFileAtomically(o.rules_out, placement::writeKtRules(plan.placement, model));
  if (!o.hardware_out.empty())
    io::writeFileAtomically(o.hardware_out, placement::hardwareToYaml(hw));
  // LoRA experts (issue 32): what lora_experts (auto: the memory left over) gives this plan.
  const placement::LoraExpertsChoice lora_experts =
      o.chat_context > 0 ? placement::LoraExpertsChoice{}
                         : train::loraExpertsFor(config, model, plan);
  placement::addLoraExpertsToPlan(plan, request, lora_experts);
  const bool distributed = o.job.worldSize() > 1 && o.chat_context == 0;
  const std::optional<placement::SequenceFit> sequence_fit =
      o.chat_context > 0 ? std::nullopt
                         : std::optional(placement::longestSequenceThatFits(request, hw, plan));
  const train::JobSummary job = train::summarizeJob(config, plan, o.job);
  std::string no_cost_model;
  const std::optional<PlanCostModel> cost =
      planCostModel(request, plan, hw, o.hardware.empty(), o.calibrate, &no_cost_model);
  if (o.json) {
    nlohmann::json out = toJson(plan, hw, model);
    if (sequence_fit) out["sequence_fit"] = sequenceFitJson(*sequence_fit);
    out["lora_experts"] = {{"requested", config.lora_experts},
                           {"paths", lora_experts.paths},
                           {"le_dim", lora_experts.le_dim},
                           {"bytes_per_layer", lora_experts.bytes_per_layer},
                           {"reason", lora_experts.reason}};
    if (distributed) {
      out["job"] = {{"world_size", job.world_size},
                    {"nnodes", o.job.nnodes},
                    {"nproc_per_node", o.job.nproc_per_node},
                    {"global_batch", job.global_batch},
                    {"lora_gradient_bytes", job.gradient_bytes},
                    {"allreduce_bytes_per_rank", job.traffic_bytes_per_rank}};
    }
    if (cost) out["cost_model"] = costModelJson(*cost);
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    printHuman(plan, config, model, hw, o.chat_context);
    if (sequence_fit) printSequenceFit(*sequence_fit);
    if (!lora_experts.reason.empty())
      std::printf("\nLoRA experts  %s\n", lora_experts.reason.c_str());
    if (distributed) {
      std::printf("\n");
      for (const std::string& line : job.lines) std::printf("%s\n", line.c_str());
    }
    if (cost) printCostModel(*cost);
    if (!no_cost_model.empty()) std::printf("\npredicted step: %s\n", no_cost_model.c_str());
    if (!o.rules_out.empty())
      std::printf("\nwrote the placement as a KTransformers rule file: %s\n", o.rules_out.c_str());
  }
}

}  // namespace

void addPlanCommand(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  auto* command =
      app.add_subcommand("plan",
                         "Will a training config fit? Bytes per GPU and NUMA node by category, "
                         "the placement of every module, and what to change when it does not fit");
  command->add_option("config", options->config, "LLaMA-Factory training YAML")->required();
  command->add_option(
      "--hardware", options->hardware,
      "a preset name from presets/hardware/ or a preset file (default: this machine)");
  command->add_flag("--json", options->json, "Print one JSON object instead of text");
  command->add_flag("--calibrate", options->calibrate,
                    "Measure this machine's rates for the cost model again (about a second; "
                    "otherwise the cached ones, see docs/cost_model.md)");
  command->add_flag(
      "--split-layers", options->split_layers,
      "Let shared experts and dense MLPs leave their layer's GPU before attention does "
      "(the runtime today runs a layer on one device)");
  command->add_option(
      "--placement", options->placement,
      "Evaluate this placement: a KTransformers rule file or a presets/placement/ file "
      "(default: the config's kt_optimize_rule, else the planner's own)");
  command->add_option("--rules-out", options->rules_out,
                      "Write the placement as a KTransformers rule file");
  command->add_option(
      "--hardware-out", options->hardware_out,
      "Write the hardware planned for as a preset file (e.g. this machine, to plan on another)");
  command
      ->add_option("--chat-context", options->chat_context,
                   "Plan chatting with the model (and its adapter) at this many tokens of context "
                   "instead of training")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--nnodes", options->job.nnodes, "Plan a data-parallel job over this many nodes")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--nproc-per-node", options->job.nproc_per_node,
                   "Plan a data-parallel job with this many ranks per node")
      ->check(CLI::PositiveNumber);
  command->callback([options] { runPlan(*options); });
}

}  // namespace tandem::cli
