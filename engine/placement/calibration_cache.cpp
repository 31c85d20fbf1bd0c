#include "engine/placement/calibration_cache.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/hash.h"
#include "engine/io/atomic_file.h"

namespace tandem::placement {

namespace {

using nlohmann::json;

constexpr int kFormatVersion = 1;

json curveJson(const RateCurve& curve) {
  json points = json::array();
  for (const RatePoint& p : curve.points)
    points.push_back({p.tokens_per_expert, p.forward_flops_per_s, p.backward_flops_per_s});
  return points;
}

bool positive(double v) { return std::isfinite(v) && v > 0; }

// Throws (json's exceptions, or std::runtime_error) on anything a measured curve cannot be.
RateCurve curveFrom(const json& points) {
  RateCurve curve;
  for (const json& p : points.at("points")) {
    RatePoint point{p.at(0).get<double>(), p.at(1).get<double>(), p.at(2).get<double>()};
    if (!positive(point.tokens_per_expert) || !positive(point.forward_flops_per_s) ||
        !positive(point.backward_flops_per_s) ||
        (!curve.points.empty() && point.tokens_per_expert <= curve.points.back().tokens_per_expert))
      throw std::runtime_error("bad rate point");
    curve.points.push_back(point);
  }
  return curve;
}

}  // namespace

std::string CalibrationKey::text() const {
  std::ostringstream out;
  out << "cpu=" << cpu_model << ";cores=" << cpu_cores << ";gpus=";
  for (size_t i = 0; i < gpu_names.size(); ++i) out << (i ? "," : "") << gpu_names[i];
  out << ";torch=" << torch_version << ";cuda=" << cuda_version << ";tandem=" << tandem_version
      << ";shape=" << hidden << "x" << intermediate << ";expert_lora=" << expert_lora_rank;
  return out.str();
}

std::string machineRatesToJson(const MachineRates& rates, const CalibrationKey& key) {
  json out = json::parse(machineRatesToJson(rates));
  out["key"] = key.text();
  return out.dump(1);
}

std::optional<MachineRates> machineRatesFromJson(const std::string& json_text,
                                                 const CalibrationKey& key) {
  try {
    if (json::parse(json_text).at("key").get<std::string>() != key.text()) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::optional<MachineRates> rates = machineRatesFromJson(json_text);
  if (rates) rates->source = "cache";
  return rates;
}

std::string machineRatesToJson(const MachineRates& rates) {
  json cpu = json::array();
  for (const ExpertEngineRates& r : rates.cpu)
    cpu.push_back({{"backend", r.backend},
                   {"format", r.format},
                   {"points", curveJson(r.curve)},
                   {"forward_call_ms", r.forward_call_ms},
                   {"backward_call_ms", r.backward_call_ms}});
  json gpus = json::array();
  for (const GpuRates& g : rates.gpus) {
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"host_to_device_bytes_per_s", g.host_to_device_bytes_per_s},
                    {"device_to_host_bytes_per_s", g.device_to_host_bytes_per_s},
                    {"expert_gemm", {{"points", curveJson(g.expert_gemm)}}},
                    {"dense_flops_per_s", g.dense_flops_per_s}});
  }
  const json out = {{"format_version", kFormatVersion},
                    {"source", rates.source},
                    {"cpu", cpu},
                    {"host_memory_bytes_per_s", rates.host_memory_bytes_per_s},
                    {"cpu_dense_flops_per_s", rates.cpu_dense_flops_per_s},
                    {"gpus", gpus},
                    {"notes", rates.notes}};
  return out.dump(1);
}

std::optional<MachineRates> machineRatesFromJson(const std::string& json_text) {
  try {
    const json in = json::parse(json_text);
    if (in.at("format_version").get<int>() != kFormatVersion) return std::nullopt;
    MachineRates rates;
    rates.source = in.value("source", std::string("recorded"));
    for (const json& c : in.at("cpu")) {
      ExpertEngineRates r{c.at("backend").get<std::string>(), c.at("format").get<std::string>(),
                          curveFrom(c), c.at("forward_call_ms").get<double>(),
                          c.at("backward_call_ms").get<double>()};
      if (!(r.forward_call_ms >= 0) || !(r.backward_call_ms >= 0)) return std::nullopt;
      rates.cpu.push_back(std::move(r));
    }
    rates.host_memory_bytes_per_s = in.at("host_memory_bytes_per_s").get<double>();
    rates.cpu_dense_flops_per_s = in.at("cpu_dense_flops_per_s").get<double>();
    for (const json& g : in.at("gpus")) {
      GpuRates r;
      r.index = g.at("index").get<int>();
      r.name = g.at("name").get<std::string>();
      r.host_to_device_bytes_per_s = g.at("host_to_device_bytes_per_s").get<double>();
      r.device_to_host_bytes_per_s = g.at("device_to_host_bytes_per_s").get<double>();
      r.expert_gemm = curveFrom(g.at("expert_gemm"));
      r.dense_flops_per_s = g.at("dense_flops_per_s").get<double>();
      if (!positive(r.host_to_device_bytes_per_s) || !positive(r.device_to_host_bytes_per_s) ||
          !positive(r.dense_flops_per_s))
        return std::nullopt;
      rates.gpus.push_back(r);
    }
    rates.notes = in.at("notes").get<std::vector<std::string>>();
    if (rates.cpu.empty() || !positive(rates.host_memory_bytes_per_s) ||
        !positive(rates.cpu_dense_flops_per_s))
      return std::nullopt;
    return rates;
  } catch (const std::exception&) {  // json's parse / type / range errors, a bad point
    return std::nullopt;
  }
}

std::filesystem::path calibrationCachePath(const CalibrationKey& key,
                                           const std::filesystem::path& cache_dir) {
  Fnv1a64 hash;
  hash.addField(key.text());
  return cache_dir / "calibration" / (hash.hex() + ".json");
}

std::optional<MachineRates> readCalibrationCache(const CalibrationKey& key,
                                                 const std::filesystem::path& cache_dir) {
  std::ifstream in(calibrationCachePath(key, cache_dir), std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return std::nullopt;
  return machineRatesFromJson(text.str(), key);
}

void writeCalibrationCache(const MachineRates& rates, const CalibrationKey& key,
                           const std::filesystem::path& cache_dir) {
  const std::filesystem::path path = calibrationCachePath(key, cache_dir);
  std::filesystem::create_directories(path.parent_path());
  io::writeFileAtomically(path, machineRatesToJson(rates, key));
}

}  // namespace tandem::placement
