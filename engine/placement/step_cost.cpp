#include "engine/placement/step_cost.h"

#include <algorithm>
#include <numeric>

#include "engine/core/error.h"
#include "engine/placement/memory_model.h"

namespace tandem::placement {

namespace {

enum class Pass { Forward, Backward, Recompute };

// The per-layer work that is not the routed experts, in FLOP, for one pass over `tokens`.
struct DenseFlops {
  double before_experts = 0;  // attention (projections and scores), router, dense MLP
  double shared = 0;          // shared experts: run beside the routed ones
};

DenseFlops denseFlops(const io::ModelConfig& m, int layer, int64_t tokens, Pass pass) {
  const auto T = static_cast<double>(tokens);
  const bool moe = m.isMoeLayer(layer);
  double linear = static_cast<double>(memory::moduleParameters(m, ModuleKind::Attention));
  if (moe) linear += static_cast<double>(memory::moduleParameters(m, ModuleKind::Router));
  if (!moe) linear += static_cast<double>(memory::moduleParameters(m, ModuleKind::DenseMlp));
  const double shared =
      moe ? static_cast<double>(memory::moduleParameters(m, ModuleKind::SharedExperts)) : 0.0;
  const int64_t head_dim =
      m.head_dim > 0 ? m.head_dim : m.hidden_size / std::max(1, m.num_attention_heads);
  // Causal scores and their weighted sum: 2 products of T × T / 2 × heads × head_dim, 2 FLOP each.
  const double scores =
      2.0 * T * T * static_cast<double>(m.num_attention_heads) * static_cast<double>(head_dim);
  // Frozen base weights: the backward is the dX product only (as much as the forward); the
  // scores' backward has two products per forward one.
  const double score_factor = pass == Pass::Backward ? 2.0 : 1.0;
  return {2.0 * linear * T + scores * score_factor, 2.0 * shared * T};
}

double ms(double flops, double rate) { return rate > 0 ? 1e3 * flops / rate : 0; }

struct Context {
  const StepCostRequest& request;
  const MachineRates& rates;
  const StepRouting& routing;
  const GpuRates* gpu;
  double act_bytes;    // one [tokens, H] activation
  LayerCosts forward;  // per-expert costs by pass
  LayerCosts backward;

  double denseRate() const { return gpu ? gpu->dense_flops_per_s : rates.cpu_dense_flops_per_s; }
  const LayerCosts& costs(Pass pass) const { return pass == Pass::Backward ? backward : forward; }
  std::vector<Pass> passes() const {
    if (!request.training) return {Pass::Forward};
    if (request.gradient_checkpointing) return {Pass::Forward, Pass::Recompute, Pass::Backward};
    return {Pass::Forward, Pass::Backward};
  }
};

// The `count` most routed experts of a layer (ties: lower id), ascending ids.
std::vector<int64_t> hottest(const std::vector<int64_t>& tokens, int64_t count) {
  std::vector<int64_t> ids(tokens.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
    return tokens[static_cast<size_t>(a)] > tokens[static_cast<size_t>(b)];
  });
  ids.resize(static_cast<size_t>(std::clamp<int64_t>(count, 0, static_cast<int64_t>(ids.size()))));
  std::sort(ids.begin(), ids.end());
  return ids;
}

enum class Kind { Co, Offload, Split };

// Offload mode's device-side staging of one streamed expert: int8 weights become their values in
// the model dtype (2 bytes a weight written), int4 stay packed (their own bytes).
double offloadStagingMs(const Context& c) {
  if (!c.gpu || c.gpu->offload_staging_bytes_per_s <= 0) return 0;
  const io::ModelConfig& m = c.request.model;
  const double bytes =
      c.request.weight_format.starts_with("int4")
          ? c.forward.expert_bytes
          : 6.0 * static_cast<double>(m.hidden_size) * static_cast<double>(m.moe_intermediate_size);
  return 1e3 * bytes / c.gpu->offload_staging_bytes_per_s;
}

// The split with `streamed` experts streamed (the most routed after the resident ones) and the
// rest on the CPU, priced as splitLayer prices its own choice.
ExpertSplit forcedSplit(const LayerCosts& costs, const std::vector<int64_t>& tokens,
                        const std::vector<int64_t>& resident_ids, int64_t streamed) {
  ExpertSplit split = splitLayer(costs, tokens, resident_ids);  // resident set, base work
  std::vector<int64_t> others = split.streamed;
  others.insert(others.end(), split.cpu.begin(), split.cpu.end());
  std::stable_sort(others.begin(), others.end(), [&](int64_t a, int64_t b) {
    return tokens[static_cast<size_t>(a)] > tokens[static_cast<size_t>(b)];
  });
  split.streamed.clear();
  split.cpu.clear();
  split.cpu_ms = costs.cpu_base_ms;
  split.gpu_ms = costs.gpu_base_ms;
  for (const int64_t e : split.resident)
    split.gpu_ms += costs.gpuMs(tokens[static_cast<size_t>(e)]);
  bool cpu_called = false;
  for (const int64_t e : others) {
    const int64_t t = tokens[static_cast<size_t>(e)];
    if (std::ssize(split.streamed) < streamed && t > 0) {
      split.streamed.push_back(e);
      split.gpu_ms += costs.gpuMs(t) + costs.streamedGpuMs();
      split.cpu_ms += costs.streamedGpuMs();  // the host issues it first (splitLayer)
    } else {
      split.cpu.push_back(e);
      split.cpu_ms += costs.cpuMs(t);
      cpu_called = cpu_called || t > 0;
    }
  }
  const bool gpu_computes = !split.resident.empty() || !split.streamed.empty();
  if (cpu_called)
    split.cpu_ms +=
        costs.cpu_call_ms +
        (gpu_computes ? (costs.pass == LayerPass::ForwardAndBackward ? 2.0 : 1.0) : 0.0) *
            costs.split_cpu_call_ms;
  split.copy_ms = std::max(
      0.0, static_cast<double>(split.streamed.size()) * costs.copyMs() - costs.copy_head_start_ms);
  return split;
}

// Adds the step's layers under one mode; returns the step's milliseconds.
double layersMs(const Context& c, Kind kind, int64_t resident, ModePrediction& p) {
  const io::ModelConfig& m = c.request.model;
  double step_ms = 0;
  double offload_copy_ms = 0, offload_gpu_ms = 0, offload_sync_ms = 0;  // offload: MoE totals
  size_t moe_index = 0;
  const size_t moe_layers = c.routing.tokens_per_expert.size();
  for (int layer = 0; layer < m.num_hidden_layers; ++layer) {
    const bool moe = m.isMoeLayer(layer);
    const bool first_moe = moe && moe_index == 0;
    const bool last_moe = moe && moe_index + 1 == moe_layers;
    const std::vector<int64_t>* tokens =
        moe ? &c.routing.tokens_per_expert.at(moe_index++) : nullptr;
    const std::vector<int64_t> resident_ids =
        moe && c.gpu ? hottest(*tokens, resident) : std::vector<int64_t>{};
    for (const Pass pass : c.passes()) {
      const DenseFlops flops = denseFlops(m, layer, c.request.tokens, pass);
      const double dense_ms = ms(flops.before_experts, c.denseRate());
      const double shared_ms = ms(flops.shared, c.denseRate());
      if (c.gpu) {
        p.parts.gpu_dense_ms += dense_ms + shared_ms;
      } else {
        p.parts.cpu_dense_ms += dense_ms + shared_ms;
      }
      if (!moe) {
        step_ms += dense_ms + shared_ms;
        continue;
      }
      // The routing's round trip to the host before the layer's experts can start (every GPU
      // mode groups the pairs on the host); the GPU waits (offload mode: below, beside its copy).
      if (c.gpu) {
        p.parts.gpu_wait_ms += c.gpu->layer_sync_ms;
        if (kind != Kind::Offload) step_ms += c.gpu->layer_sync_ms;
      }
      const LayerCosts& costs = c.costs(pass);
      const bool cpu_skips = pass == Pass::Recompute && c.request.keep_expert_forward;
      double cpu_ms = 0, gpu_ms = 0, copy_ms = 0;
      if (kind == Kind::Offload) {
        for (const int64_t t : *tokens) gpu_ms += costs.gpuMs(t);
        // Copied for the forward and once more for the recomputation and backward together;
        // the streamer serves the layer it served last again without a copy, which in training
        // is the first MoE layer's forward (the step before ended with it) and the last one's
        // recomputation (right after its forward): expert_streamer.h.
        const bool copies = pass != Pass::Backward || !c.request.gradient_checkpointing;
        const bool turn = c.request.training && ((pass == Pass::Forward && first_moe) ||
                                                 (pass != Pass::Forward && last_moe && copies));
        if (copies && !turn) {
          const auto streamed = static_cast<double>(tokens->size() - resident_ids.size());
          copy_ms = streamed * costs.copyMs();
          gpu_ms += streamed * offloadStagingMs(c);
        }
        // The routing's trip to the host idles the GPU, not the copy engine. With checkpointing
        // the copy for a layer's recomputation overlaps its backward too (the streamer copies the
        // layer before while this one recomputes and runs backward).
        // The streamer keeps copying ahead while the GPU computes (it waits only for a free
        // buffer), so over the step the copy engine and the GPU overlap: the step's MoE layers take
        // the busier of the two (measured on the H200: offload's step within 1 % of its GPU's
        // busy time, the routing's trip to the host hidden behind the queued work).
        offload_gpu_ms += dense_ms + shared_ms + gpu_ms;
        offload_sync_ms += c.gpu ? c.gpu->layer_sync_ms : 0.0;
        offload_copy_ms += copy_ms;
      } else {
        LayerCosts layer_costs = costs;
        layer_costs.gpu_base_ms = c.gpu ? shared_ms : 0;
        layer_costs.cpu_base_ms = c.gpu ? 0 : shared_ms;  // no GPU: the CPU runs them in turn
        layer_costs.copy_head_start_ms = dense_ms;
        ExpertSplit split;
        // co / resident, and any pass whose CPU experts' forward is kept (nothing to balance:
        // the CPU skips its share, the GPU recomputes its resident experts).
        if (kind == Kind::Co || cpu_skips) {
          split.cpu_ms = layer_costs.cpu_base_ms;
          split.gpu_ms = layer_costs.gpu_base_ms;
          std::vector<char> is_res(tokens->size(), 0);
          for (const int64_t id : resident_ids) is_res[static_cast<size_t>(id)] = 1;
          bool cpu_called = false;
          for (size_t e = 0; e < tokens->size(); ++e) {
            if (is_res[e]) {
              split.gpu_ms += costs.gpuMs((*tokens)[e]);
            } else {
              split.cpu_ms += costs.cpuMs((*tokens)[e]);
              cpu_called = cpu_called || (*tokens)[e] > 0;
            }
          }
          if (cpu_called) split.cpu_ms += costs.cpu_call_ms;
        } else if (c.request.split_streamed_experts >= 0) {
          split = forcedSplit(layer_costs, *tokens, resident_ids, c.request.split_streamed_experts);
        } else {
          split = splitLayer(layer_costs, *tokens, resident_ids);
        }
        if (kind == Kind::Split && pass == Pass::Forward)
          p.layer_splits.push_back({layer, std::ssize(split.resident), std::ssize(split.streamed),
                                    std::ssize(split.cpu)});
        if (cpu_skips) split.cpu_ms = layer_costs.cpu_base_ms;
        cpu_ms = split.cpu_ms - layer_costs.cpu_base_ms;
        gpu_ms = split.gpu_ms - layer_costs.gpu_base_ms;
        copy_ms = static_cast<double>(split.streamed.size()) * costs.copyMs();
        // The CPU's experts need the layer's input on the host and send their output back.
        const bool cpu_work = cpu_ms > 0 && c.gpu;
        const double to_host = cpu_work ? 1e3 * c.act_bytes / c.gpu->device_to_host_bytes_per_s : 0;
        const double to_gpu = cpu_work ? 1e3 * c.act_bytes / c.gpu->host_to_device_bytes_per_s : 0;
        p.parts.copy_to_host_ms += to_host;
        p.parts.copy_to_gpu_ms += to_gpu;
        step_ms += dense_ms + to_host + to_gpu +
                   (c.gpu ? std::max({split.cpu_ms, split.gpu_ms, split.copy_ms})
                          : split.cpu_ms);  // no GPU: shared experts and experts in turn
      }
      if (pass == Pass::Recompute) {
        p.parts.cpu_recompute_ms += cpu_ms;
      } else {
        p.parts.cpu_experts_ms += cpu_ms;
      }
      p.parts.gpu_experts_ms += gpu_ms;
      p.parts.copy_to_gpu_ms += copy_ms;
    }
  }
  // The routing's trips to the host idle the GPU unless copies pace it (then they overlap the
  // wait for a copy): offload-resident with every expert resident waits as resident mode does.
  step_ms +=
      std::max(offload_copy_ms, offload_gpu_ms + (offload_copy_ms > 0 ? 0 : offload_sync_ms));
  // lm_head and the loss: forward and the backward's dX, on the dense device.
  const double head_ms =
      ms(2.0 * 2.0 * static_cast<double>(m.vocab_size) * static_cast<double>(m.hidden_size) *
             static_cast<double>(c.request.tokens),
         c.denseRate());
  (c.gpu ? p.parts.gpu_dense_ms : p.parts.cpu_dense_ms) += head_ms;
  return step_ms + head_ms;
}

ModePrediction predictMode(const Context& c, const std::string& name, Kind kind, int64_t resident) {
  ModePrediction p;
  p.mode = name;
  if (!c.gpu && name != "co" && name != "split") {
    p.available = false;
    p.why_not = "needs a GPU";
    return p;
  }
  if (name.find("resident") != std::string::npos && resident <= 0) {
    p.available = false;
    p.why_not = "the GPU has no room for resident experts";
    return p;
  }
  double step_ms = layersMs(c, kind, resident, p);
  // The fused CPU AdamW reads the parameter, its gradient and both moments and writes three back:
  // 7 fp32 streams per expert LoRA parameter, after the backward.
  p.parts.optimizer_ms = c.rates.host_memory_bytes_per_s > 0
                             ? 1e3 * 28.0 * static_cast<double>(c.request.expert_lora_parameters) /
                                   c.rates.host_memory_bytes_per_s
                             : 0;
  step_ms += p.parts.optimizer_ms;
  const StepParts& s = p.parts;
  p.cpu_busy_ms = s.cpu_experts_ms + s.cpu_recompute_ms + s.cpu_dense_ms + s.optimizer_ms;
  p.copy_busy_ms = s.copy_to_gpu_ms + s.copy_to_host_ms;
  p.gpu_busy_ms = s.gpu_experts_ms + s.gpu_dense_ms;
  p.step_ms = step_ms;
  p.tokens_per_s = step_ms > 0 ? 1e3 * static_cast<double>(c.request.tokens) / step_ms : 0;
  return p;
}

}  // namespace

StepRouting balancedRouting(const io::ModelConfig& model, int64_t tokens) {
  StepRouting routing;
  const int64_t E = model.num_experts;
  if (E <= 0) return routing;
  const int64_t pairs = tokens * model.num_experts_per_tok;
  std::vector<int64_t> layer(static_cast<size_t>(E), pairs / E);
  for (int64_t e = 0; e < pairs % E; ++e) ++layer[static_cast<size_t>(e)];
  for (int l = 0; l < model.num_hidden_layers; ++l) {
    if (model.isMoeLayer(l)) routing.tokens_per_expert.push_back(layer);
  }
  return routing;
}

LayerCosts layerCosts(const StepCostRequest& request, const MachineRates& rates, bool backward) {
  const ExpertCostShape shape{request.model.hidden_size, request.model.moe_intermediate_size,
                              static_cast<double>(memory::residentExpertBytes(
                                  request.model, request.weight_format, request.bf16)),
                              request.weight_format, request.gpu};
  return expertLayerCosts(rates, shape, backward ? LayerPass::Backward : LayerPass::Forward);
}

const ModePrediction* StepPrediction::mode(const std::string& name) const {
  if (name == "split") return &split;
  for (const ModePrediction& m : modes) {
    if (m.mode == name) return &m;
  }
  return nullptr;
}

StepPrediction predictStep(const StepCostRequest& request, const MachineRates& rates,
                           const StepRouting& routing) {
  const io::ModelConfig& m = request.model;
  int moe_layers = 0;
  for (int l = 0; l < m.num_hidden_layers; ++l) moe_layers += m.isMoeLayer(l) ? 1 : 0;
  if (static_cast<int>(routing.tokens_per_expert.size()) != moe_layers)
    throw Error("the routing has " + std::to_string(routing.tokens_per_expert.size()) +
                    " MoE layers, the model " + std::to_string(moe_layers),
                "give one tokens-per-expert list per MoE layer");
  for (const std::vector<int64_t>& layer : routing.tokens_per_expert) {
    if (static_cast<int64_t>(layer.size()) != m.num_experts)
      throw Error("a routing layer lists " + std::to_string(layer.size()) +
                      " experts, the model has " + std::to_string(m.num_experts),
                  "give a count for every routed expert");
  }
  if (moe_layers > 0 && !rates.cpuFor(request.weight_format))
    throw Error("the machine's rates have no CPU expert engine rate",
                "calibrate on this machine (tandem plan --calibrate) or use a preset with AMX or "
                "AVX-512 BF16");
  const GpuRates* gpu = rates.gpu(request.gpu);
  const double act_bytes = static_cast<double>(request.tokens) *
                           static_cast<double>(m.hidden_size) * (request.bf16 ? 2.0 : 4.0);
  const Context c{request,
                  rates,
                  routing,
                  gpu,
                  act_bytes,
                  layerCosts(request, rates, false),
                  layerCosts(request, rates, true)};
  StepPrediction out;
  if (!gpu) out.notes.push_back("no GPU rates: everything runs on the CPU");
  const int64_t resident = gpu ? request.resident_experts : 0;
  out.modes.push_back(predictMode(c, "co", Kind::Co, 0));
  out.modes.push_back(predictMode(c, "resident", Kind::Co, resident));
  out.modes.push_back(predictMode(c, "offload", Kind::Offload, 0));
  out.modes.push_back(predictMode(c, "offload-resident", Kind::Offload, resident));
  out.split = predictMode(c, "split", Kind::Split, resident);
  out.lower_bound_ms = out.split.step_ms;
  for (const ModePrediction& p : out.modes) {
    if (p.available) out.lower_bound_ms = std::min(out.lower_bound_ms, p.step_ms);
  }
  out.lower_bound_tokens_per_s =
      out.lower_bound_ms > 0 ? 1e3 * static_cast<double>(request.tokens) / out.lower_bound_ms : 0;
  return out;
}

}  // namespace tandem::placement
