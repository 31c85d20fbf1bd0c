#include "engine/experts/expert_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "engine/core/float_convert.h"
#include "engine/experts/block_test_util.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::testing {

namespace {
struct Rng {
  uint64_t state;
  double uniform(double lo, double hi) {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * static_cast<double>(z >> 11) * 0x1.0p-53;
  }
  int64_t below(int64_t n) { return std::min<int64_t>(n - 1, uniform(0, 1) * n); }
};

int64_t inOf(const ExpertLayerSpec& l, int p) { return p == 2 ? l.intermediate : l.hidden; }
int64_t outOf(const ExpertLayerSpec& l, int p) { return p == 2 ? l.hidden : l.intermediate; }

bool targets(const ExpertLoraSpec& lora, int p) {
  return lora.rank > 0 && (p == 0 ? lora.gate : p == 1 ? lora.up : lora.down);
}

// Block types: random tables (block_test_util.h), each expert one byte past a 4-byte boundary
// with a gap after it; values are what the reference decoder makes of them.
void makeBlockWeights(Rng& rng, const ProblemSpec& spec, int64_t n_out, int64_t n_in,
                      std::vector<double>& values, std::vector<unsigned char>& bytes,
                      std::vector<const void*>& views) {
  const int64_t E = spec.layer.num_experts, per_expert = n_out * n_in;
  const uint64_t table = blockTableBytes(spec.weight_type, spec.int4, n_out, n_in, "test");
  const int64_t stride = static_cast<int64_t>(table) + 64 + 5;
  bytes.assign(E * stride + 16, 0);
  values.resize(E * per_expert);
  std::mt19937 mt(static_cast<uint32_t>(rng.uniform(0, 1) * 4294967295.0));
  const auto bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n_in)));
  const int64_t n_blocks =
      static_cast<int64_t>(table) / blockLayout(spec.weight_type, spec.int4).bytes;
  std::vector<float> w(per_expert);
  for (int64_t e = 0; e < E; ++e) {
    unsigned char* base = bytes.data() + 1 + e * stride;
    const std::vector<unsigned char> blocks =
        randomBlocks(spec.weight_type, spec.int4, n_blocks, bound, mt);
    std::memcpy(base, blocks.data(), blocks.size());
    kernels::ref::dequantBlocks(spec.weight_type, spec.int4, base, n_blocks, w.data());
    for (int64_t i = 0; i < per_expert; ++i) values[e * per_expert + i] = w[i];
    views.push_back(base);
  }
}

// Random [E, out, in] weights rounded to `type`; bytes hold each expert 2 bytes past a 4-byte
// boundary with a gap between experts, as unaligned, non-contiguous views must work.
// FP8_E4M3: codes with 128 × 128 block scales (amax / 448 per block, as DeepSeek-V3 ships them)
// in `scales` [E][ceil(out/128) · ceil(in/128)]; values are what they dequantise to.
void makeWeights(Rng& rng, const ProblemSpec& spec, int p, std::vector<double>& values,
                 std::vector<unsigned char>& bytes, std::vector<const void*>& views,
                 std::vector<std::vector<float>>& scales, std::vector<const float*>& scale_views) {
  const int64_t E = spec.layer.num_experts;
  const int64_t n_in = inOf(spec.layer, p), n_out = outOf(spec.layer, p);
  if (isBlockType(spec.weight_type)) {
    makeBlockWeights(rng, spec, n_out, n_in, values, bytes, views);
    return;
  }
  const int64_t elem = weightTypeBytes(spec.weight_type), per_expert = n_out * n_in;
  const int64_t stride = per_expert * elem + 64 + 6;
  values.resize(E * per_expert);
  bytes.assign(E * stride + 16, 0);
  const double bound = 1.0 / std::sqrt(static_cast<double>(n_in));
  const int64_t block = kFp8BlockSize, block_cols = (n_in + block - 1) / block;
  for (int64_t e = 0; e < E; ++e) {
    unsigned char* base = bytes.data() + 2 + e * stride;
    views.push_back(base);
    std::vector<float> raw(per_expert);
    for (float& v : raw) v = static_cast<float>(rng.uniform(-bound, bound));
    if (spec.weight_type == WeightType::FP8_E4M3) {
      std::vector<float>& scale =
          scales.emplace_back(((n_out + block - 1) / block) * block_cols, 0.0f);
      for (int64_t i = 0; i < per_expert; ++i) {
        float& s = scale[(i / n_in / block) * block_cols + (i % n_in) / block];
        s = std::max(s, std::fabs(raw[i]) / 448.0f);
      }
      for (int64_t i = 0; i < per_expert; ++i) {
        const float s = scale[(i / n_in / block) * block_cols + (i % n_in) / block];
        base[i] = floatToFp8E4M3(raw[i] / s);
        values[e * per_expert + i] = static_cast<double>(fp8E4M3ToFloat(base[i])) * s;
      }
      continue;
    }
    for (int64_t i = 0; i < per_expert; ++i) {
      const float v = raw[i];
      if (spec.weight_type == WeightType::F32) {
        std::memcpy(base + i * 4, &v, 4);
        values[e * per_expert + i] = v;
      } else {
        const bool bf16 = spec.weight_type == WeightType::BF16;
        const uint16_t bits = bf16 ? floatToBf16(v) : floatToFp16(v);
        std::memcpy(base + i * 2, &bits, 2);
        values[e * per_expert + i] = bf16 ? bf16ToFloat(bits) : fp16ToFloat(bits);
      }
    }
  }
  for (const auto& scale : scales) scale_views.push_back(scale.data());
}

void makeRouting(Rng& rng, const ProblemSpec& spec, Problem& problem) {
  const int64_t E = spec.layer.num_experts;
  const int64_t usable = spec.routing == Routing::Sparse ? (E + 1) / 2 : E;
  for (int64_t t = 0; t < spec.n_tokens; ++t) {
    std::vector<int32_t> chosen;
    if (spec.routing == Routing::Skewed) chosen.push_back(0);
    while (static_cast<int>(chosen.size()) < spec.top_k) {
      auto id = static_cast<int32_t>(rng.below(usable) * (spec.routing == Routing::Sparse ? 2 : 1));
      if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) chosen.push_back(id);
    }
    for (int j = 0; j < spec.top_k; ++j) {
      problem.ids.push_back(chosen[j]);
      problem.weights.push_back(static_cast<float>(rng.uniform(0.05, 1.0)));
    }
  }
}

std::vector<double> randomActivations(Rng& rng, int64_t n, ActivationType type) {
  std::vector<double> v(n);
  for (double& value : v) value = rng.uniform(-1, 1);
  return fromActivations(toActivations(v, type), type);
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }
double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// One projection of one expert in fp64: W [out, in], optional LoRA a [r, in], b [out, r].
struct RefProj {
  const double* w = nullptr;
  const float* a = nullptr;
  const float* b = nullptr;
  int64_t n_in = 0, n_out = 0;
  int r = 0;
  double s = 0;

  std::vector<double> forward(const std::vector<double>& in, std::vector<double>& z) const {
    std::vector<double> out(n_out, 0.0);
    z.assign(r, 0.0);  // z = A in
    for (int q = 0; q < r; ++q)
      for (int64_t c = 0; c < n_in; ++c) z[q] += a[q * n_in + c] * in[c];
    for (int64_t o = 0; o < n_out; ++o) {
      for (int64_t c = 0; c < n_in; ++c) out[o] += w[o * n_in + c] * in[c];
      for (int q = 0; q < r; ++q) out[o] += s * b[o * r + q] * z[q];
    }
    return out;
  }
  // d_in = Wᵀ d_out + s Aᵀ (Bᵀ d_out); dB += s d_out ⊗ z; dA += s (Bᵀ d_out) ⊗ in.
  std::vector<double> backward(const std::vector<double>& in, const std::vector<double>& z,
                               const std::vector<double>& d_out, double* grad_a,
                               double* grad_b) const {
    std::vector<double> d_in(n_in, 0.0), t(r, 0.0);
    for (int64_t o = 0; o < n_out; ++o) {
      for (int64_t c = 0; c < n_in; ++c) d_in[c] += w[o * n_in + c] * d_out[o];
      for (int q = 0; q < r; ++q) {
        t[q] += b[o * r + q] * d_out[o];
        grad_b[o * r + q] += s * d_out[o] * z[q];
      }
    }
    for (int q = 0; q < r; ++q) {
      for (int64_t c = 0; c < n_in; ++c) {
        d_in[c] += s * a[q * n_in + c] * t[q];
        grad_a[q * n_in + c] += s * t[q] * in[c];
      }
    }
    return d_in;
  }
};

RefProj refProj(const Problem& pr, int p, int64_t e) {
  const ExpertLayerSpec& l = pr.spec.layer;
  const std::vector<double>& w = p == 0 ? pr.gate : p == 1 ? pr.up : pr.down;
  RefProj proj;
  proj.n_in = inOf(l, p);
  proj.n_out = outOf(l, p);
  proj.w = w.data() + e * proj.n_in * proj.n_out;
  if (targets(pr.spec.lora, p)) {
    proj.r = pr.spec.lora.rank;
    proj.s = pr.spec.lora.scale;
    proj.a = pr.lora[p].a.data() + e * proj.r * proj.n_in;
    proj.b = pr.lora[p].b.data() + e * proj.r * proj.n_out;
  }
  return proj;
}
}  // namespace

std::string ProblemSpec::describe() const {
  std::ostringstream out;
  out << "E=" << layer.num_experts << " H=" << layer.hidden << " I=" << layer.intermediate
      << " T=" << n_tokens << " k=" << top_k << " act=" << activationTypeName(act_type)
      << " w=" << weightTypeName(weight_type) << " lora r=" << lora.rank << (lora.gate ? " g" : "")
      << (lora.up ? " u" : "") << (lora.down ? " d" : "") << " routing="
      << (routing == Routing::Random   ? "random"
          : routing == Routing::Skewed ? "skewed"
                                       : "sparse");
  return out.str();
}

std::vector<double> fromActivations(const std::vector<unsigned char>& raw, ActivationType type) {
  const size_t n = raw.size() / activationTypeBytes(type);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (type == ActivationType::F32) {
      float v;
      std::memcpy(&v, raw.data() + 4 * i, 4);
      out[i] = v;
    } else {
      uint16_t bits;
      std::memcpy(&bits, raw.data() + 2 * i, 2);
      out[i] = bf16ToFloat(bits);
    }
  }
  return out;
}

std::vector<unsigned char> toActivations(const std::vector<double>& values, ActivationType type) {
  std::vector<unsigned char> raw(values.size() * activationTypeBytes(type));
  for (size_t i = 0; i < values.size(); ++i) {
    const auto v = static_cast<float>(values[i]);
    if (type == ActivationType::F32) {
      std::memcpy(raw.data() + 4 * i, &v, 4);
    } else {
      const uint16_t bits = floatToBf16(v);
      std::memcpy(raw.data() + 2 * i, &bits, 2);
    }
  }
  return raw;
}

Problem makeProblem(const ProblemSpec& spec) {
  Problem pr;
  pr.spec = spec;
  Rng rng{spec.seed * 0x2545f4914f6cdd1dull + 7};
  pr.views.type = spec.weight_type;
  pr.views.int4 = spec.int4;
  makeWeights(rng, spec, 0, pr.gate, pr.gate_bytes, pr.views.gate, pr.scales[0],
              pr.views.gate_scale);
  makeWeights(rng, spec, 1, pr.up, pr.up_bytes, pr.views.up, pr.scales[1], pr.views.up_scale);
  makeWeights(rng, spec, 2, pr.down, pr.down_bytes, pr.views.down, pr.scales[2],
              pr.views.down_scale);
  if (isBlockType(spec.weight_type)) {
    const ExpertLayerSpec& shape = spec.layer;
    const auto table = [&](int64_t out, int64_t in) {
      return std::vector<uint64_t>(static_cast<size_t>(shape.num_experts),
                                   blockTableBytes(spec.weight_type, spec.int4, out, in, "test"));
    };
    pr.views.gate_bytes = table(shape.intermediate, shape.hidden);
    pr.views.up_bytes = table(shape.intermediate, shape.hidden);
    pr.views.down_bytes = table(shape.hidden, shape.intermediate);
  }
  const ExpertLayerSpec& l = spec.layer;
  for (int p = 0; p < kExpertProjCount; ++p) {
    if (!targets(spec.lora, p)) continue;
    const int r = spec.lora.rank;
    const double a_bound = 1.0 / std::sqrt(static_cast<double>(inOf(l, p)));
    const double b_bound = 1.0 / std::sqrt(static_cast<double>(r));
    for (int64_t i = 0; i < l.num_experts * r * inOf(l, p); ++i)
      pr.lora[p].a.push_back(static_cast<float>(rng.uniform(-a_bound, a_bound)));
    for (int64_t i = 0; i < l.num_experts * r * outOf(l, p); ++i)
      pr.lora[p].b.push_back(static_cast<float>(rng.uniform(-b_bound, b_bound)));
  }
  pr.x = randomActivations(rng, spec.n_tokens * l.hidden, spec.act_type);
  pr.dy = randomActivations(rng, spec.n_tokens * l.hidden, spec.act_type);
  pr.x_raw = toActivations(pr.x, spec.act_type);
  pr.dy_raw = toActivations(pr.dy, spec.act_type);
  makeRouting(rng, spec, pr);
  return pr;
}

Grads denseReference(const Problem& pr) {
  const ExpertLayerSpec& l = pr.spec.layer;
  const int64_t H = l.hidden, I = l.intermediate, T = pr.spec.n_tokens;
  const int k = pr.spec.top_k;
  Grads out;
  out.y.assign(T * H, 0.0);
  out.dx.assign(T * H, 0.0);
  out.dw.assign(T * k, 0.0);
  for (int p = 0; p < kExpertProjCount; ++p) {
    out.grad_a[p].assign(pr.lora[p].a.size(), 0.0);
    out.grad_b[p].assign(pr.lora[p].b.size(), 0.0);
  }
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> x(pr.x.begin() + t * H, pr.x.begin() + (t + 1) * H);
    const std::vector<double> dy(pr.dy.begin() + t * H, pr.dy.begin() + (t + 1) * H);
    for (int j = 0; j < k; ++j) {
      const int64_t e = pr.ids[t * k + j];
      if (e == kMaskedSlot) continue;  // computed elsewhere: contributes nothing, d w = 0
      const double w = pr.weights[t * k + j];
      const RefProj gate = refProj(pr, 0, e), up = refProj(pr, 1, e), down = refProj(pr, 2, e);
      std::vector<double> zg, zu, zd;
      const std::vector<double> g = gate.forward(x, zg), u = up.forward(x, zu);
      std::vector<double> h(I);
      for (int64_t i = 0; i < I; ++i) h[i] = silu(g[i]) * u[i];
      const std::vector<double> o = down.forward(h, zd);
      std::vector<double> d_o(H);
      for (int64_t c = 0; c < H; ++c) {
        out.y[t * H + c] += w * o[c];
        out.dw[t * k + j] += dy[c] * o[c];
        d_o[c] = w * dy[c];
      }
      auto gradPtr = [&](std::vector<double>& v, int64_t per) {
        return v.empty() ? nullptr : v.data() + e * per;
      };
      auto back = [&](const RefProj& proj, int p, const std::vector<double>& in,
                      const std::vector<double>& z, const std::vector<double>& d) {
        return proj.backward(in, z, d, gradPtr(out.grad_a[p], proj.r * proj.n_in),
                             gradPtr(out.grad_b[p], proj.r * proj.n_out));
      };
      const std::vector<double> dh = back(down, 2, h, zd, d_o);
      std::vector<double> dg(I), du(I);
      for (int64_t i = 0; i < I; ++i) {
        const double sig = sigmoid(g[i]);
        dg[i] = dh[i] * u[i] * sig * (1.0 + g[i] * (1.0 - sig));
        du[i] = dh[i] * silu(g[i]);
      }
      const std::vector<double> dxg = back(gate, 0, x, zg, dg), dxu = back(up, 1, x, zu, du);
      for (int64_t c = 0; c < H; ++c) out.dx[t * H + c] += dxg[c] + dxu[c];
    }
  }
  return out;
}

std::unique_ptr<ExpertLayer> makeLayer(const Problem& pr, std::string_view backend,
                                       ThreadPool& pool) {
  ExpertLayerOptions options;
  options.backend = std::string(backend);
  return makeLayer(pr, options, pool);
}

std::unique_ptr<ExpertLayer> makeLayer(const Problem& pr, const ExpertLayerOptions& options,
                                       ThreadPool& pool) {
  ExpertLayerOptions with_activations = options;
  with_activations.activations = pr.spec.act_type;  // what runLayer gives forward()
  auto layer = ExpertLayer::create(pr.spec.layer, pr.views, pr.spec.lora, with_activations, pool);
  for (int p = 0; p < kExpertProjCount; ++p) {
    const auto proj = static_cast<ExpertProj>(p);
    if (!layer->lora().targets(proj)) continue;
    const int64_t a_size = pr.spec.lora.rank * inOf(pr.spec.layer, p);
    const int64_t b_size = pr.spec.lora.rank * outOf(pr.spec.layer, p);
    for (int64_t e = 0; e < pr.spec.layer.num_experts; ++e) {
      layer->lora().loadExpert(proj, e, pr.lora[p].a.data() + e * a_size,
                               pr.lora[p].b.data() + e * b_size);
    }
  }
  return layer;
}

Grads collectLoraGrads(const Problem& pr, const ExpertLayer& layer, Grads grads) {
  for (int p = 0; p < kExpertProjCount; ++p) {
    grads.grad_a[p].clear();
    grads.grad_b[p].clear();
    const auto proj = static_cast<ExpertProj>(p);
    if (!layer.lora().targets(proj)) continue;
    for (int64_t e = 0; e < pr.spec.layer.num_experts; ++e) {
      for (float v : layer.lora().gradA(proj, e)) grads.grad_a[p].push_back(v);
      for (float v : layer.lora().gradB(proj, e)) grads.grad_b[p].push_back(v);
    }
  }
  return grads;
}

Grads runLayer(const Problem& pr, ExpertLayer& layer) {
  const ActivationType act = pr.spec.act_type;
  const int64_t n = pr.spec.n_tokens * pr.spec.layer.hidden;
  std::vector<unsigned char> y(n * activationTypeBytes(act)), dx(y.size());
  Grads out;
  out.dw.assign(pr.spec.n_tokens * pr.spec.top_k, 0.0);
  // NaN: backward must write every slot's d weight (0 for a masked one).
  std::vector<float> dw(out.dw.size(), std::numeric_limits<float>::quiet_NaN());
  ExpertForwardCache cache;
  layer.forward(pr.x_raw.data(), act, pr.spec.n_tokens, pr.ids.data(), pr.weights.data(),
                pr.spec.top_k, y.data(), &cache);
  layer.backward(cache, pr.dy_raw.data(), dx.data(), dw.data());
  out.y = fromActivations(y, act);
  out.dx = fromActivations(dx, act);
  out.dw.assign(dw.begin(), dw.end());
  return collectLoraGrads(pr, layer, std::move(out));
}

::testing::AssertionResult closeTo(const std::string& what, const std::vector<double>& got,
                                   const std::vector<double>& want, Tolerance tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " != expected " << want.size();
  }
  double diff2 = 0, want2 = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff2 += (got[i] - want[i]) * (got[i] - want[i]);
    want2 += want[i] * want[i];
  }
  const double rms = want.empty() ? 0.0 : std::sqrt(want2 / want.size());
  const double rel = want2 > 0 ? std::sqrt(diff2 / want2) : std::sqrt(diff2);
  size_t bad = got.size(), worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    if (err > std::abs(got[worst] - want[worst]) || std::isnan(err)) worst = i;
    if (bad == got.size() && !(err <= tol.elem * (std::abs(want[i]) + rms))) bad = i;
  }
  if (bad != got.size() || !(rel <= tol.rel_l2)) {
    const size_t i = bad != got.size() ? bad : worst;
    return ::testing::AssertionFailure()
           << what << ": rel-L2 " << rel << " (tol " << tol.rel_l2 << "), "
           << (bad != got.size() ? "first bad" : "worst") << " index " << i << " got " << got[i]
           << " want " << want[i];
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult gradsClose(const Problem& pr, const Grads& got, const Grads& want,
                                      Tolerance tol) {
  const std::string tag = " [" + pr.spec.describe() + "]";
  if (auto r = closeTo("y" + tag, got.y, want.y, tol); !r) return r;
  if (auto r = closeTo("dx" + tag, got.dx, want.dx, tol); !r) return r;
  if (auto r = closeTo("d_topk_weights" + tag, got.dw, want.dw, tol); !r) return r;
  for (int p = 0; p < kExpertProjCount; ++p) {
    const std::string name(expertProjName(static_cast<ExpertProj>(p)));
    if (auto r = closeTo("grad A " + name + tag, got.grad_a[p], want.grad_a[p], tol); !r) return r;
    if (auto r = closeTo("grad B " + name + tag, got.grad_b[p], want.grad_b[p], tol); !r) return r;
  }
  return ::testing::AssertionSuccess();
}

void expectIdentical(const Grads& got, const Grads& want) {
  EXPECT_EQ(got.y, want.y);
  EXPECT_EQ(got.dx, want.dx);
  EXPECT_EQ(got.dw, want.dw);
  for (int p = 0; p < kExpertProjCount; ++p) {
    EXPECT_EQ(got.grad_a[p], want.grad_a[p]) << expertProjName(static_cast<ExpertProj>(p));
    EXPECT_EQ(got.grad_b[p], want.grad_b[p]) << expertProjName(static_cast<ExpertProj>(p));
  }
}

}  // namespace tandem::experts::testing
