// expert_layer_tool: one ExpertLayer forward + backward on expert weights read from a GGUF file as
// their blocks (zero-copy views into the mapped file), for the parity test against the PyPI `gguf`
// package's dequantisation (tests/parity/test_expert_blocks.py).
//
//   expert_layer_tool IN.gguf OUT.gguf [FORMAT [BACKEND [ACT [nodequant]]]]
//
// IN.gguf holds gate, up [E, I, H] and down [E, H, I] (block types the experts take, each its
// own), x, dy
// [T, H] f32, ids [T, k] i32, weights [T, k] f32, and per projection P (gate, up, down) P.lora_a
// [E, r, in], P.lora_b [E, out, r] f32, with metadata test.lora_scale (f32). FORMAT: blocks
// (default) or int4[:gN][:asym]; BACKEND: auto (default) or a backend name; ACT: f32 (default) or
// bf16. OUT.gguf gets y, dx [T, H], dw [T, k], P.grad_a, P.grad_b and P.dequant (the reference
// decoder's fp32 of the weights as stored, for an exact comparison; not with `nodequant`, which
// bench/expert_blocks_rss.py uses to measure what the layer itself holds). Exit 0, 1 on a
// tandem::Error (printed), 2 on bad usage.

#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/kernels/packed_gemm.h"
#include "engine/io/gguf.h"

namespace {

using namespace tandem;
using namespace tandem::experts;

const char* const kProjNames[] = {"gate", "up", "down"};

const io::GgufTensorInfo& tensor(const io::GgufFile& file, const std::string& name) {
  const io::GgufTensorInfo* info = file.findTensor(name);
  if (!info) throw Error(file.path().string() + " has no tensor " + name);
  return *info;
}

std::vector<float> floats(const io::GgufFile& file, const std::string& name) {
  return file.dequantize(tensor(file, name));
}

struct Output {
  std::string name;
  std::vector<int64_t> ne;
  std::vector<float> data;
};

int run(int argc, char** argv) {
  const io::GgufFile file = io::GgufFile::open(argv[1]);
  const std::string format_name = argc > 3 ? argv[3] : "blocks";
  const std::string backend = argc > 4 ? argv[4] : "auto";
  const bool bf16 = argc > 5 && std::string(argv[5]) == "bf16";
  const bool dequant = !(argc > 6 && std::string(argv[6]) == "nodequant");

  const io::GgufTensorInfo& gate = tensor(file, "gate");
  if (gate.ne.size() != 3) throw Error("gate must be [E, I, H]");
  ExpertLayerSpec spec{gate.ne[2], gate.ne[0], gate.ne[1]};
  const io::GgufTensorInfo& ids_info = tensor(file, "ids");
  const int top_k = static_cast<int>(ids_info.ne[0]);
  const int64_t T = ids_info.ne[1], H = spec.hidden;

  ExpertWeightViews views;
  views.type =
      expertWeightTypeOfGgml(static_cast<uint32_t>(gate.type), io::ggmlTypeName(gate.type), "gate");
  std::vector<Output> outputs;
  for (int p = 0; p < 3; ++p) {
    const io::GgufTensorInfo& info = tensor(file, kProjNames[p]);
    // Each projection in its own block type, as GGUF files mix them (Q4_K_M's Q6_K down_proj).
    views.proj_types.push_back(expertWeightTypeOfGgml(static_cast<uint32_t>(info.type),
                                                      io::ggmlTypeName(info.type), kProjNames[p]));
    const std::span<const std::byte> bytes = file.tensorBytes(info);
    const uint64_t per_expert = bytes.size() / static_cast<uint64_t>(spec.num_experts);
    auto& ptrs = p == 0 ? views.gate : p == 1 ? views.up : views.down;
    auto& sizes = p == 0 ? views.gate_bytes : p == 1 ? views.up_bytes : views.down_bytes;
    for (int64_t e = 0; e < spec.num_experts; ++e) {
      ptrs.push_back(bytes.data() + e * per_expert);
      sizes.push_back(per_expert);
    }
    if (!dequant) {
      for (int64_t e = 0; e < spec.num_experts; ++e)
        checkBlockTable(views.proj_types.back(), views.int4, info.ne[1], info.ne[0], per_expert,
                        kProjNames[p]);
      continue;
    }
    // The reference decoder's values of the stored weights.
    const int64_t rows = info.ne[1], cols = info.ne[0];
    Output deq{std::string(kProjNames[p]) + ".dequant", info.ne, {}};
    deq.data.resize(static_cast<size_t>(rows * cols * spec.num_experts));
    for (int64_t e = 0; e < spec.num_experts; ++e) {
      kernels::SourceMatrix src;
      src.data = ptrs[e];
      src.type = views.proj_types.back();
      src.rows = rows;
      src.cols = cols;
      checkBlockTable(src.type, views.int4, rows, cols, per_expert, kProjNames[p]);
      kernels::dequantise(src, deq.data.data() + e * rows * cols);
    }
    outputs.push_back(std::move(deq));
  }

  const std::vector<float> lora_a0 = floats(file, "gate.lora_a");
  const int rank = static_cast<int>(tensor(file, "gate.lora_a").ne[1]);
  ExpertLoraSpec lora{rank, static_cast<float>(file.getFloat("test.lora_scale")), true, true, true};
  ExpertLayerOptions options;
  options.backend = backend;
  options.format = parseWeightFormat(format_name, &options.int4);
  options.activations = bf16 ? ActivationType::BF16 : ActivationType::F32;
  ThreadPool pool(2);
  auto layer = ExpertLayer::create(spec, views, lora, options, pool);
  for (int p = 0; p < 3; ++p) {
    const std::vector<float> a = floats(file, std::string(kProjNames[p]) + ".lora_a");
    const std::vector<float> b = floats(file, std::string(kProjNames[p]) + ".lora_b");
    const int64_t in = p == 2 ? spec.intermediate : H, out = p == 2 ? H : spec.intermediate;
    for (int64_t e = 0; e < spec.num_experts; ++e) {
      layer->lora().loadExpert(static_cast<ExpertProj>(p), e, a.data() + e * rank * in,
                               b.data() + e * out * rank);
    }
  }

  const std::vector<float> x = floats(file, "x"), dy = floats(file, "dy");
  const std::vector<float> weights = floats(file, "weights");
  std::vector<int32_t> ids(static_cast<size_t>(T * top_k));
  std::memcpy(ids.data(), file.tensorBytes(ids_info).data(), ids.size() * 4);
  const auto to_act = [&](const std::vector<float>& v) {
    std::vector<unsigned char> raw(v.size() * (bf16 ? 2 : 4));
    for (size_t i = 0; i < v.size(); ++i) {
      if (bf16) {
        const uint16_t bits = floatToBf16(v[i]);
        std::memcpy(raw.data() + 2 * i, &bits, 2);
      } else {
        std::memcpy(raw.data() + 4 * i, &v[i], 4);
      }
    }
    return raw;
  };
  const auto from_act = [&](const std::vector<unsigned char>& raw) {
    std::vector<float> v(raw.size() / (bf16 ? 2 : 4));
    for (size_t i = 0; i < v.size(); ++i) {
      if (bf16) {
        uint16_t bits;
        std::memcpy(&bits, raw.data() + 2 * i, 2);
        v[i] = bf16ToFloat(bits);
      } else {
        std::memcpy(&v[i], raw.data() + 4 * i, 4);
      }
    }
    return v;
  };
  const ActivationType act = bf16 ? ActivationType::BF16 : ActivationType::F32;
  const std::vector<unsigned char> x_raw = to_act(x), dy_raw = to_act(dy);
  std::vector<unsigned char> y(x_raw.size()), dx(x_raw.size());
  std::vector<float> dw(static_cast<size_t>(T * top_k));
  ExpertForwardCache cache;
  layer->forward(x_raw.data(), act, T, ids.data(), weights.data(), top_k, y.data(), &cache);
  layer->backward(cache, dy_raw.data(), dx.data(), dw.data());

  outputs.push_back({"y", {H, T}, from_act(y)});
  outputs.push_back({"dx", {H, T}, from_act(dx)});
  outputs.push_back({"dw", {top_k, T}, dw});
  for (int p = 0; p < 3; ++p) {
    const int64_t in = p == 2 ? spec.intermediate : H, out = p == 2 ? H : spec.intermediate;
    Output ga{std::string(kProjNames[p]) + ".grad_a", {in, rank, spec.num_experts}, {}};
    Output gb{std::string(kProjNames[p]) + ".grad_b", {rank, out, spec.num_experts}, {}};
    for (int64_t e = 0; e < spec.num_experts; ++e) {
      const auto a = layer->lora().gradA(static_cast<ExpertProj>(p), e);
      const auto b = std::as_const(*layer).lora().gradB(static_cast<ExpertProj>(p), e);
      ga.data.insert(ga.data.end(), a.begin(), a.end());
      gb.data.insert(gb.data.end(), b.begin(), b.end());
    }
    outputs.push_back(std::move(ga));
    outputs.push_back(std::move(gb));
  }
  std::vector<io::GgufTensorToWrite> to_write;
  for (const Output& o : outputs) {
    to_write.push_back({o.name, io::GgmlType::F32, o.ne,
                        std::as_bytes(std::span<const float>(o.data.data(), o.data.size()))});
  }
  // This process's peak resident memory (VmHWM: its own mm since exec, unlike getrusage's
  // ru_maxrss, which keeps the high-water mark of the process it was forked from), for
  // bench/expert_blocks_rss.py.
  if (std::FILE* status = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, status)) {
      if (std::strncmp(line, "VmHWM:", 6) == 0) std::fprintf(stderr, "peak_rss %s", line + 6);
    }
    std::fclose(status);
  }
  io::writeGguf(
      argv[2],
      {{"test.weight_format", io::GgufValue::ofString(std::string(layer->weightFormatName()))},
       {"test.backend", io::GgufValue::ofString(layer->backendName())}},
      to_write);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: expert_layer_tool IN.gguf OUT.gguf [FORMAT [BACKEND [ACT]]]\n");
    return 2;
  }
  try {
    return run(argc, argv);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "error: %s\n%s\n", e.what(), e.whatToDo().c_str());
    return 1;
  }
}
