// The e2e bench's int8 weights cache (issue 28): a random model's routed experts written as the
// CPU engine's int8 rows, and read back as f32 weights that quantise to the same rows bitwise.
// Qwen3-30B-A3B at 48 layers: 31 GB instead of 61 GB in bf16, which the single-H200 machine's
// 64 GB disk could not hold beside the build.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/experts/kernels/packed_gemm.h"
#include "engine/io/atomic_file.h"
#include "engine/model/weight_loader.h"

namespace tandem::model {

namespace {

constexpr const char* kInt8Suffix = "_int8";
constexpr const char* kAmaxSuffix = "_int8_amax";

// A routed expert's own weight: "model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight".
bool isRoutedExpertWeight(const std::string& name, const at::Tensor& t) {
  static const std::regex expert(R"(\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$)");
  return t.dim() == 2 && std::regex_search(name, expert);
}

io::DType dtypeOf(const at::Tensor& t, const std::string& name) {
  switch (t.scalar_type()) {
    case at::kFloat: return io::DType::F32;
    case at::kBFloat16: return io::DType::BF16;
    case at::kHalf: return io::DType::F16;
    default:
      throw Error("tensor " + name +
                  " has a type Tandem does not write: " + c10::toString(t.scalar_type()));
  }
}

// One entry of the file: a tensor as it is, or an expert's int8 values or row maxima.
struct Entry {
  std::string name;
  io::DType dtype;
  std::vector<int64_t> shape;
  uint64_t bytes;
  const at::Tensor* source;
  enum Part { Plain, Int8, Amax } part;
};

}  // namespace

void WeightLoader::writeSynthesized(const std::filesystem::path& file, bool int8_experts) const {
  if (released_owned_) {
    throw Error(
        "the random model's expert weights were freed once the experts were copied "
        "(offload mode's host copy, or the CPU engine's own packs in cpu and auto modes)",
        "build the random model to write with ModelOptions::keep_random_experts");
  }
  if (!int8_experts) {
    writeTensorFile(file, owned_);
    return;
  }
  std::vector<Entry> entries;
  for (const auto& [name, t] : owned_) {
    if (!isRoutedExpertWeight(name, t)) {
      entries.push_back({name, dtypeOf(t, name), t.sizes().vec(), t.nbytes(), &t, Entry::Plain});
      continue;
    }
    const int64_t rows = t.size(0), cols = t.size(1);
    entries.push_back({name + kInt8Suffix,
                       io::DType::U8,
                       {rows, cols},
                       static_cast<uint64_t>(rows * cols),
                       &t,
                       Entry::Int8});
    entries.push_back({name + kAmaxSuffix,
                       io::DType::F32,
                       {rows},
                       static_cast<uint64_t>(rows) * 4,
                       &t,
                       Entry::Amax});
  }
  // The safetensors layout (io::writeSafetensors'): u64 header length, JSON padded to 8 bytes.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"tandem_experts", "int8_rows"}};
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    header[e.name] = {{"dtype", io::dtypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::array<unsigned char, 8> length{};
  for (size_t i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  io::writeFileAtomically(file, [&](std::FILE* out) {
    std::fwrite(length.data(), 1, length.size(), out);
    std::fwrite(text.data(), 1, text.size(), out);
    // An expert's two entries follow each other: quantised once, for both.
    const at::Tensor* quantised = nullptr;
    std::vector<int8_t> q;
    std::vector<float> scale, amax;
    for (const Entry& e : entries) {
      if (e.part == Entry::Plain) {
        const at::Tensor t = e.source->to(at::kCPU).contiguous();
        std::fwrite(t.data_ptr(), 1, t.nbytes(), out);
        continue;
      }
      if (quantised != e.source) {
        quantised = e.source;
        const at::Tensor w = e.source->to(at::kCPU, at::kFloat).contiguous();
        const int64_t rows = w.size(0), cols = w.size(1);
        q.resize(static_cast<size_t>(rows * cols));
        scale.resize(static_cast<size_t>(rows));
        amax.assign(static_cast<size_t>(rows), 0.0f);
        const float* wp = w.data_ptr<float>();
        // The CPU engine's quantiser (what every int8 path runs on the weights it is given).
        experts::kernels::quantiseRowsInt8(wp, rows, cols, q.data(), scale.data());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c)
            amax[static_cast<size_t>(r)] =
                std::max(amax[static_cast<size_t>(r)], std::fabs(wp[r * cols + c]));
        }
      }
      if (e.part == Entry::Int8)
        std::fwrite(q.data(), 1, q.size(), out);
      else
        std::fwrite(amax.data(), sizeof(float), amax.size(), out);
    }
  });
}

bool WeightLoader::isInt8Rows(const std::string& name) const {
  return !synthetic_ && !gguf_ && files_.contains(name + kInt8Suffix);
}

at::Tensor WeightLoader::dequantizeInt8Rows(const std::string& name,
                                            const std::vector<int64_t>& shape) const {
  const std::string values_name = name + kInt8Suffix, amax_name = name + kAmaxSuffix;
  auto corrupt = [&](const std::string& what) {
    return Error("the weights in " + dir_.string() + " are corrupt: " + what,
                 "delete the directory; the e2e bench's next run writes it again");
  };
  if (shape.size() != 2) throw corrupt(name + " is not a matrix");
  const io::TensorView values = files_.view(values_name);
  if (values.info->dtype != io::DType::U8 || values.info->shape != shape)
    throw corrupt(values_name + " is not U8 of the shape config.json implies");
  if (!files_.contains(amax_name)) throw corrupt(amax_name + " is missing");
  const io::TensorView amax = files_.view(amax_name);
  const int64_t rows = shape[0], cols = shape[1];
  if (amax.info->dtype != io::DType::F32 || amax.info->shape != std::vector<int64_t>{rows})
    throw corrupt(amax_name + " is not F32 [" + std::to_string(rows) + "]");
  const auto* q = reinterpret_cast<const int8_t*>(values.bytes.data());
  const auto* row_max = reinterpret_cast<const float*>(amax.bytes.data());
  at::Tensor w = at::empty(shape, at::kFloat);
  float* out = w.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float m = row_max[r];
      if (!std::isfinite(m) || m < 0) throw corrupt(amax_name + " holds " + std::to_string(m));
      // The quantiser's scale, bitwise: max |w| of these values is m again (only ±127 reach it).
      const float scale = m > 0.0f ? m / 127.0f : 1.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const int8_t v = q[r * cols + c];
        out[r * cols + c] = v == 127 ? m : v == -127 ? -m : static_cast<float>(v) * scale;
      }
    }
  });
  return w;
}

}  // namespace tandem::model
