// `tandem bench experts`: the CPU expert engine against the plain libtorch per-expert loop and
// oneDNN, on the expert layers of real models, with the machine's ceilings measured in the same
// run. Prints one JSON object (also written to --json FILE); progress goes to stderr.

#include "bench/experts/experts_bench_command.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/experts/expert_layer_bench.h"
#include "bench/experts/libtorch_expert_loop.h"
#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/numa.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::bench {

namespace {

struct ExpertsBenchArgs {
  std::string json_path;
  std::vector<std::string> shapes, routings, backends, dtypes, task_splits;
  std::vector<int64_t> tokens;
  int threads = 0;
  int nodes = 0;  // NUMA nodes the layers split over (0: TANDEM_EXPERT_NODES or the machine's)
  int64_t resident = 0;  // experts per layer resident on a GPU (makeBenchProblem)
  bool quick = false;
  int repeats = 0;
};

// The (backend, dtype) pairs to time: every fast backend this CPU runs in its own format, the
// fp8 checkpoint through the best bf16 backend, unless --backends / --dtypes narrow it.
std::vector<BenchLayerConfig> layerConfigs(const ExpertsBenchArgs& args) {
  using experts::WeightFormat;
  const CpuFeatures& cpu = cpuFeatures();
  const auto wanted = [](const std::vector<std::string>& list, const std::string& name) {
    return list.empty() || std::find(list.begin(), list.end(), name) != list.end();
  };
  std::vector<BenchLayerConfig> configs;
  const std::string best_bf16 =
      experts::kernels::selectGemmBackend("auto", WeightFormat::Bf16, cpu).name();
  for (const std::string name :
       {"amx_bf16", "amx_int8", "avx512_bf16", "onednn", "avx512", "avx2", "generic"}) {
    // fp32 fallbacks: only when asked, except avx2 where it is the best this CPU has.
    const bool explicit_only =
        name == "avx512" || name == "generic" || (name == "avx2" && best_bf16 != name);
    if (args.backends.empty() && explicit_only) continue;
    if (!wanted(args.backends, name)) continue;
    for (const WeightFormat format : {WeightFormat::Bf16, WeightFormat::Int8}) {
      const auto names = experts::kernels::availableGemmBackends(cpu, format);
      if (std::find(names.begin(), names.end(), name) == names.end()) continue;
      const std::string dtype(experts::weightFormatName(format));
      const bool own_format =
          name == "amx_int8" ? format == WeightFormat::Int8 : format == WeightFormat::Bf16;
      if (own_format && wanted(args.dtypes, dtype)) configs.push_back({name, dtype});
    }
  }
  if (wanted(args.dtypes, "fp8")) {
    if (wanted(args.backends, best_bf16)) configs.push_back({best_bf16, "fp8"});
  }
  // int4 and GGUF blocks only when asked (--dtypes), on the backends that decode them.
  const std::string best_blocks =
      experts::kernels::selectGemmBackend("auto", WeightFormat::Blocks, cpu).name();
  for (const std::string& dtype : args.dtypes) {
    if (dtype.rfind("int4", 0) != 0 && !benchBlockType(dtype)) continue;
    for (const std::string name :
         {"amx_blocks", "avx512_bf16_blocks", "avx512", "avx2", "generic"}) {
      const bool asked = args.backends.empty() ? name == best_blocks : wanted(args.backends, name);
      const auto names = experts::kernels::availableGemmBackends(cpu, WeightFormat::Blocks);
      if (asked && std::find(names.begin(), names.end(), name) != names.end())
        configs.push_back({name, dtype});
    }
  }
  return configs;
}

nlohmann::json caseJson(const BenchProblem& p, const std::string& backend, const std::string& dtype,
                        const BenchTiming& t, double weight_bytes, double peak_tflops,
                        double mem_gbps) {
  const double seconds = (t.fwd_ms + t.bwd_ms) / 1e3;
  const double flops = benchFlops(p), bytes = benchBytes(p, weight_bytes);
  const double bound = std::max(flops / (peak_tflops * 1e12), bytes / (mem_gbps * 1e9));
  nlohmann::json out = {{"model_shape", p.shape.name},
                        {"tokens", p.tokens},
                        {"top_k", p.shape.top_k},
                        {"routing", std::string(benchRoutingName(p.routing))},
                        {"backend", backend},
                        {"dtype", dtype},
                        {"fwd_ms", t.fwd_ms},
                        {"bwd_ms", t.bwd_ms},
                        {"tokens_per_s", static_cast<double>(p.tokens) / seconds},
                        {"tflops", flops / seconds / 1e12},
                        {"gbytes_per_s", bytes / seconds / 1e9},
                        {"roofline_fraction", bound / seconds},
                        {"active_experts", p.activeExperts()}};
  if (p.resident > 0) {
    out["resident_experts"] = p.resident;
    out["cpu_tokens"] = p.cpu_tokens;
    out["cpu_pairs"] = p.pairs();
  }
  if (t.fwd_cpu_ms > 0) {
    out["fwd_cpu_ms"] = t.fwd_cpu_ms;
    out["bwd_cpu_ms"] = t.bwd_cpu_ms;
  }
  return out;
}

// Speed-ups over libtorch_loop and zipf-over-uniform time ratios, per comparable case.
nlohmann::json ratiosJson(const nlohmann::json& cases) {
  std::map<std::string, double> seconds;
  const auto key = [](const nlohmann::json& c, const std::string& routing) {
    return c["model_shape"].get<std::string>() + "/" + std::to_string(c["tokens"].get<int64_t>()) +
           "/" + routing + "/" + c["backend"].get<std::string>() + "/" +
           c["dtype"].get<std::string>() + "/" + c.value("task_split", std::string("auto"));
  };
  for (const auto& c : cases) {
    seconds[key(c, c["routing"])] = c["fwd_ms"].get<double>() + c["bwd_ms"].get<double>();
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : cases) {
    if (c["backend"] == "libtorch_loop") continue;
    nlohmann::json r = {{"model_shape", c["model_shape"]},
                        {"tokens", c["tokens"]},
                        {"routing", c["routing"]},
                        {"backend", c["backend"]},
                        {"dtype", c["dtype"]}};
    if (c.contains("task_split")) r["task_split"] = c["task_split"];
    nlohmann::json base = c;
    base["backend"] = "libtorch_loop";
    base["dtype"] = "bf16";
    base.erase("task_split");
    const double own = seconds[key(c, c["routing"])];
    if (auto it = seconds.find(key(base, c["routing"])); it != seconds.end()) {
      r["speedup_vs_libtorch_loop"] = it->second / own;
    }
    if (c.value("task_split", std::string()) == "columns") {
      nlohmann::json rows = c;
      rows["task_split"] = "rows";
      if (auto it = seconds.find(key(rows, c["routing"])); it != seconds.end()) {
        r["columns_over_rows_time"] = own / it->second;
      }
    }
    if (c["routing"] == "zipf") {
      if (auto it = seconds.find(key(c, "uniform")); it != seconds.end()) {
        r["zipf_over_uniform_time"] = own / it->second;
      }
    }
    out.push_back(r);
  }
  return out;
}

// Fills the defaults (--quick narrows them) and rejects what cannot run, before anything is timed.
void settleArgs(ExpertsBenchArgs& args) {
  if (args.quick) {
    if (args.shapes.empty()) args.shapes = {"qwen3_30b"};
    if (args.tokens.empty()) args.tokens = {512, 2048};
  }
  if (args.shapes.empty()) args.shapes = {"qwen3_30b", "dsv2_lite", "dsv3_32e"};
  if (args.tokens.empty()) args.tokens = {512, 2048, 8192};
  if (args.routings.empty()) args.routings = {"uniform", "zipf"};
  if (args.repeats <= 0) args.repeats = args.quick ? 1 : 3;
  if (args.threads <= 0)
    args.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (const auto& name : args.shapes)
    checkBenchResident(benchShape(name), args.resident);  // up front
  for (const auto& name : args.routings) parseBenchRouting(name);
  for (const int64_t t : args.tokens) {
    if (t <= 0) throw Error("bench: --tokens must be positive, got " + std::to_string(t));
  }
  for (const auto& name : args.backends) {
    const std::vector<std::string> known = {
        "amx_bf16", "amx_int8", "amx_blocks", "avx512_bf16_blocks", "avx512_bf16", "onednn",
        "avx512",   "avx2",     "generic",    "libtorch_loop"};
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw Error("bench: unknown backend '" + name + "'",
                  "use amx_bf16, amx_int8, amx_blocks, avx512_bf16_blocks, avx512_bf16, onednn, "
                  "avx512, avx2, generic or libtorch_loop");
    }
  }
  for (const auto& name : args.dtypes) {
    const bool int4 = name.rfind("int4", 0) == 0;
    if (int4) experts::parseWeightFormat(name);  // an Error names what int4 options exist
    if (name != "bf16" && name != "int8" && name != "fp8" && !int4 && !benchBlockType(name)) {
      throw Error("bench: unknown dtype '" + name + "'",
                  "use bf16, int8, fp8, int4[:g64][:asym] or a GGUF block type (q4_k, q8_0, "
                  "q4_0, q5_k, q6_k, iq4_xs, mxfp4)");
    }
  }
  if (args.nodes < 0)
    throw Error("bench: --nodes must not be negative",
                "use 0 (the machine's NUMA nodes) or a count");
  if (args.task_splits.empty()) args.task_splits = {"auto"};
}

// The layers to time: layerConfigs under every --task-split; says which backends asked for are
// not among them.
std::vector<BenchLayerConfig> timedConfigs(const ExpertsBenchArgs& args) {
  std::vector<BenchLayerConfig> configs;
  for (const BenchLayerConfig& config : layerConfigs(args)) {
    for (const auto& split : args.task_splits) {
      BenchLayerConfig c = config;
      c.numa_nodes = args.nodes;
      c.task_split = experts::parseTaskSplit(split);
      configs.push_back(c);
    }
  }
  for (const auto& name : args.backends) {
    const bool timed = name == "libtorch_loop" ||
                       std::any_of(configs.begin(), configs.end(),
                                   [&](const BenchLayerConfig& c) { return c.backend == name; });
    if (!timed) {
      std::fprintf(
          stderr,
          "bench experts: skipping %s (not available on this machine for the dtypes asked)\n",
          name.c_str());
    }
  }
  return configs;
}

bool timeLibtorch(const ExpertsBenchArgs& args) {
  const bool wanted = args.backends.empty() || std::find(args.backends.begin(), args.backends.end(),
                                                         "libtorch_loop") != args.backends.end();
  if (wanted && args.resident > 0) {
    std::fprintf(stderr,
                 "bench experts: skipping libtorch_loop (it has no masked slots for --resident)\n");
    return false;
  }
  return wanted;
}

// Workers on the CPUs after the first; the calling thread is the pool's last pair of hands.
std::vector<int> workerCpus(int threads) {
  std::vector<int> cpus;
  for (const NumaNode& node : detectNumaTopology().nodes)
    cpus.insert(cpus.end(), node.cpus.begin(), node.cpus.end());
  std::vector<int> pins;
  for (size_t i = 1; i < cpus.size() && static_cast<int>(pins.size()) < threads - 1; ++i)
    pins.push_back(cpus[i]);
  return pins;
}

struct Ceilings {
  int64_t gemm_n = 0;
  double onednn_tflops = 0, own_tflops = 0, peak = 0, mem_gbps = 0;
};

Ceilings measureCeilings(const ExpertsBenchArgs& args, ThreadPool& pool) {
  std::fprintf(stderr, "bench experts: measuring ceilings on %d threads\n", args.threads);
  Ceilings c;
  c.gemm_n = args.quick ? 2048 : 4096;
  c.onednn_tflops = experts::kernels::onednnSquareGemmTflops(c.gemm_n, args.threads, 3);
  c.own_tflops = ourSquareGemmTflops(c.gemm_n, pool, 3);
  c.peak = std::max(c.onednn_tflops, c.own_tflops);
  c.mem_gbps = streamingReadGbytesPerS(args.quick ? (512ull << 20) : (2ull << 30), pool, 5);
  std::fprintf(stderr,
               "ceilings peak_tflops_bf16 %.3f (onednn %.3f, tandem %.3f) mem_gbytes_per_s %.1f\n",
               c.peak, c.onednn_tflops, c.own_tflops, c.mem_gbps);
  return c;
}

// Every layer config on one problem, then (with_libtorch) the libtorch loop, appended to cases.
void timeProblem(BenchProblem& problem, const std::vector<BenchLayerConfig>& configs,
                 bool with_libtorch, const ExpertsBenchArgs& args, const Ceilings& ceilings,
                 ThreadPool& pool, nlohmann::json& cases) {
  const std::string routing_name(benchRoutingName(problem.routing));
  const auto tokens = static_cast<long long>(problem.tokens);
  for (const auto& config : configs) {
    if (config.dtype == "fp8" && problem.gate8.empty()) addFp8Weights(problem, pool);
    std::fprintf(stderr, "bench experts: %s tokens=%lld %s %s/%s split %s\n",
                 problem.shape.name.c_str(), tokens, routing_name.c_str(), config.backend.c_str(),
                 config.dtype.c_str(),
                 std::string(experts::taskSplitName(config.task_split)).c_str());
    const BenchLayerResult r = timeExpertLayer(problem, config, args.repeats, pool);
    nlohmann::json c = caseJson(problem, r.backend, config.dtype, r.timing, r.weight_bytes,
                                ceilings.peak, ceilings.mem_gbps);
    c["wt_policy"] = r.wt_policy;
    c["task_split"] = std::string(experts::taskSplitName(config.task_split));
    c["pack_ms"] = r.pack_ms;
    c["numa_nodes"] = r.numa_nodes;
    std::fprintf(stderr, "case %s\n", c.dump().c_str());  // survives a run cut short
    cases.push_back(c);
  }
  if (with_libtorch) {
    std::fprintf(stderr, "bench experts: %s tokens=%lld %s libtorch_loop\n",
                 problem.shape.name.c_str(), tokens, routing_name.c_str());
    const BenchTiming t = timeLibtorchExpertLoop(problem, args.threads, args.repeats);
    cases.push_back(
        caseJson(problem, "libtorch_loop", "bf16", t, 2.0, ceilings.peak, ceilings.mem_gbps));
    std::fprintf(stderr, "case %s\n", cases.back().dump().c_str());
  }
}

void printResult(const ExpertsBenchArgs& args, const Ceilings& ceilings,
                 const nlohmann::json& cases) {
  const CpuFeatures& cpu = cpuFeatures();
  nlohmann::json out = {
      {"benchmark", "experts"},
      {"machine",
       {{"cpu", cpu.brand},
        {"threads", args.threads},
        {"isa", std::string(isaLevelName(cpu.bestLevel()))},
        {"amx", cpu.amx_status},
        {"numa_nodes", detectNumaTopology().nodes.size()}}},
      {"ceilings",
       {{"peak_tflops_bf16", ceilings.peak},
        {"peak_tflops_bf16_onednn", ceilings.onednn_tflops},
        {"peak_tflops_bf16_tandem", ceilings.own_tflops},
        {"tandem_kernel",
         experts::kernels::selectGemmBackend("auto", experts::WeightFormat::Bf16, cpu).name()},
        {"gemm_size", ceilings.gemm_n},
        {"mem_gbytes_per_s", ceilings.mem_gbps}}},
      {"lora", {{"rank", 8}, {"targets", "gate_proj,up_proj,down_proj"}}},
      {"repeats", args.repeats},
      {"cases", cases},
      {"ratios", ratiosJson(cases)}};
  const std::string text = out.dump(1);
  std::printf("%s\n", text.c_str());
  if (!args.json_path.empty()) {
    std::ofstream file(args.json_path);
    file << text << "\n";
    if (!file)
      throw Error("bench: cannot write " + args.json_path,
                  "check the directory exists and is writable");
  }
}

void runExpertsBench(ExpertsBenchArgs args) {
  settleArgs(args);
  const std::vector<BenchLayerConfig> configs = timedConfigs(args);
  const bool with_libtorch = timeLibtorch(args);
  ThreadPool pool(args.threads - 1, workerCpus(args.threads));
  const Ceilings ceilings = measureCeilings(args, pool);
  nlohmann::json cases = nlohmann::json::array();
  uint64_t seed = 1;
  for (const auto& shape_name : args.shapes) {
    for (const int64_t tokens : args.tokens) {
      for (const auto& routing_name : args.routings) {
        BenchProblem problem =
            makeBenchProblem(benchShape(shape_name), tokens, parseBenchRouting(routing_name),
                             seed++, pool, args.resident);
        timeProblem(problem, configs, with_libtorch, args, ceilings, pool, cases);
      }
    }
  }
  printResult(args, ceilings, cases);
}

}  // namespace

void addExpertsBenchCommand(CLI::App& parent) {
  CLI::App* cmd = parent.add_subcommand(
      "experts",
      "CPU expert engine (fwd+bwd with expert LoRA) vs libtorch's per-expert loop and oneDNN");
  auto args = std::make_shared<ExpertsBenchArgs>();
  cmd->add_option("--json", args->json_path, "Also write the JSON object to this file");
  cmd->add_option("--shapes", args->shapes, "qwen3_30b, dsv2_lite, dsv3_32e")->delimiter(',');
  cmd->add_option("--tokens", args->tokens, "Token counts, e.g. 512,2048,8192")->delimiter(',');
  cmd->add_option("--routing", args->routings, "uniform, zipf")->delimiter(',');
  cmd->add_option("--backends", args->backends,
                  "amx_bf16, amx_int8, avx512_bf16, onednn, avx512, avx2, generic, libtorch_loop "
                  "(default: the fast ones available)")
      ->delimiter(',');
  cmd->add_option("--dtypes", args->dtypes,
                  "bf16, int8, fp8 (default: all); int4[:gN][:asym], q4_k, q8_0, ... when named")
      ->delimiter(',');
  cmd->add_option("--threads", args->threads, "Threads (default: every hardware thread)");
  cmd->add_option(
      "--nodes", args->nodes,
      "NUMA nodes to split each expert layer over, virtual ones when not the machine's count; "
      "above 1 the layers run on per-node pools over every CPU (default: TANDEM_EXPERT_NODES or "
      "the machine's)");
  cmd->add_option("--repeats", args->repeats,
                  "Timed runs per case, median reported (default 3, quick 1)");
  cmd->add_option(
         "--task-split", args->task_splits,
         "auto, rows, columns: how the layer cuts its work (default auto; several: each timed)")
      ->delimiter(',');
  cmd->add_option(
      "--resident", args->resident,
      "Experts per layer resident on a GPU (co-computation): their slots masked, only the tokens "
      "with a pair left for the CPU, as the engine gets them (default 0)");
  cmd->add_flag("--quick", args->quick,
                "Qwen3-30B-A3B shape at 512 and 2048 tokens only; smaller ceilings");
  cmd->callback([args] { runExpertsBench(*args); });
}

}  // namespace tandem::bench
