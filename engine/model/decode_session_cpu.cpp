#include "engine/model/decode_session_cpu.h"

// First, before libtorch's headers include it: GCC 12's AVX-512 headers trip
// -W(maybe-)uninitialized on their own _mm256_undefined operands (as in the experts' kernels).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/model/causal_lm.h"
#include "engine/model/kv_cache.h"

namespace tandem::model {

namespace {

using Bf16 = uint16_t;  // raw bits of a bf16 tensor's elements

const Bf16* bf16Data(const at::Tensor& t) {
  return reinterpret_cast<const Bf16*>(t.const_data_ptr<c10::BFloat16>());
}

// A bf16 CPU tensor the plan may read through a plain pointer: contiguous, of `numel` elements.
bool plainBf16(const at::Tensor& t, int64_t numel) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kBFloat16 &&
         t.is_contiguous() && t.numel() == numel;
}

// One projection: its few-row kernel called on the fp32 buffer, or (a LoRA adapter, no kernel)
// the layer's own libtorch forward on the buffer rounded to bf16.
struct Projection {
  const gpu::LoraLinear* layer = nullptr;
  const gpu::FewRowLinear* kernel = nullptr;  // null: layer->forward
  const Bf16* bias = nullptr;                 // [out] with the kernel, or null
  int64_t in = 0, out = 0;

  // x [in] -> y [out]
  void operator()(const float* x, float* y) const {
    if (kernel) {
      kernel->forward(x, 1, y);
      if (bias)
        for (int64_t i = 0; i < out; ++i) y[i] += bf16ToFloat(bias[i]);
      return;
    }
    at::Tensor xt = at::empty({1, in}, at::kBFloat16);
    floatToBf16(std::span<const float>(x, static_cast<size_t>(in)),
                std::span<uint16_t>(reinterpret_cast<uint16_t*>(xt.data_ptr<c10::BFloat16>()),
                                    static_cast<size_t>(in)));
    const at::Tensor yt = layer->forward(xt, false).to(at::kFloat).contiguous();
    std::memcpy(y, yt.const_data_ptr<float>(), static_cast<size_t>(out) * sizeof(float));
  }
};

Projection projectionOf(const gpu::LoraLinear& layer) {
  Projection p{&layer, nullptr, nullptr, layer.inFeatures(), layer.outFeatures()};
  const at::Tensor& bias = layer.bias();
  if (layer.fewRowKernel() && !layer.hasLora() && (!bias.defined() || plainBf16(bias, p.out))) {
    p.kernel = layer.fewRowKernel();
    p.bias = bias.defined() ? bf16Data(bias) : nullptr;
  }
  return p;
}

// SiLU-gated MLP (dense layers, shared experts): y = down(silu(gate(x)) * up(x)).
struct GatedProjections {
  Projection gate, up, down;
  bool defined = false;
};

GatedProjections gatedOf(const gpu::GatedMlp& mlp) {
  if (!mlp.defined()) return {};
  return {projectionOf(mlp.gate_proj), projectionOf(mlp.up_proj), projectionOf(mlp.down_proj),
          true};
}

// y = weight ⊙ x / rms(x), the mean square summed in double as gpu::rmsNorm's CPU kernel does.
void rmsNorm(const float* x, const Bf16* weight, int64_t d, float eps, float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < d; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(d)) + eps);
  for (int64_t i = 0; i < d; ++i) y[i] = bf16ToFloat(weight[i]) * (x[i] * inv);
}

// The attention's and the router's inner loops over bf16 rows: AVX2 + FMA where the CPU has them
// (this file is compiled for the baseline ISA; the kernels elsewhere dispatch the same way), else
// plain loops. They are ~15 % of a step at a few hundred positions when scalar.
bool hasAvx2Fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

__attribute__((target("avx2,fma"))) __m256 loadBf16x8(const Bf16* w) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

__attribute__((target("avx2,fma"))) float dotBf16Avx2(const float* x, const Bf16* w, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), loadBf16x8(w + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), loadBf16x8(w + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), loadBf16x8(w + i), a0);
  const __m256 a = _mm256_add_ps(a0, a1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  float sum = _mm_cvtss_f32(h);
  for (; i < n; ++i) sum += x[i] * bf16ToFloat(w[i]);
  return sum;
}

// y[i] += a · v[i]
__attribute__((target("avx2,fma"))) void axpyBf16Avx2(float a, const Bf16* v, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, loadBf16x8(v + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * bf16ToFloat(v[i]);
}

float dotBf16(const float* x, const Bf16* w, int64_t n) {
  if (hasAvx2Fma()) return dotBf16Avx2(x, w, n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * bf16ToFloat(w[i]);
  return sum;
}

void axpyBf16(float a, const Bf16* v, float* y, int64_t n) {
  if (hasAvx2Fma()) return axpyBf16Avx2(a, v, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * bf16ToFloat(v[i]);
}

// Attention of `groups` query heads that share one key/value head, over positions [0, length)
// (AVX-512; head_dim a multiple of 16): q [groups, head_dim] fp32, keys / values [length, head_dim]
// bf16 rows, probs [groups, length] scratch, out [groups, head_dim]. Each key and value row is
// widened once for the whole group (a GQA group of 4 on Qwen3 shapes), and four heads' dot
// products are summed in one reduction. The same arithmetic as the loops in Plan::attention:
// fp32 scores times `scaling`, softmax from the maximum, probabilities / total times the values.
bool hasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return has;
}

__attribute__((target("avx512f,avx512bw"))) __m512 loadBf16x16(const Bf16* w) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

__attribute__((target("avx512f,avx512bw"))) float sum16(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                                 _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE)));
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

__attribute__((target("avx512f,avx512bw"))) void attendGroupAvx512(
    const float* q, int64_t groups, const Bf16* keys, const Bf16* values, int64_t length,
    int64_t head_dim, float scaling, float* probs, float* out) {
  constexpr int64_t kMaxChunks = 16;  // head_dim ≤ 256
  const int64_t chunks = head_dim / 16;
  for (int64_t j = 0; j < length; ++j) {
    __m512 key[kMaxChunks];
    for (int64_t c = 0; c < chunks; ++c) key[c] = loadBf16x16(keys + j * head_dim + 16 * c);
    for (int64_t g = 0; g < groups; ++g) {
      const float* qg = q + g * head_dim;
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qg), key[0]);
      for (int64_t c = 1; c < chunks; ++c)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * c), key[c], acc);
      probs[g * length + j] = sum16(acc) * scaling;
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    float* p = probs + g * length;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < length; ++j) top = std::max(top, p[j]);
    float total = 0.0f;
    for (int64_t j = 0; j < length; ++j) {
      p[j] = std::exp(p[j] - top);
      total += p[j];
    }
    for (int64_t j = 0; j < length; ++j) p[j] /= total;
    std::fill(out + g * head_dim, out + (g + 1) * head_dim, 0.0f);
  }
  for (int64_t j = 0; j < length; ++j) {
    __m512 value[kMaxChunks];
    for (int64_t c = 0; c < chunks; ++c) value[c] = loadBf16x16(values + j * head_dim + 16 * c);
    for (int64_t g = 0; g < groups; ++g) {
      const __m512 weight = _mm512_set1_ps(probs[g * length + j]);
      float* og = out + g * head_dim;
      for (int64_t c = 0; c < chunks; ++c) {
        _mm512_storeu_ps(og + 16 * c,
                         _mm512_fmadd_ps(weight, value[c], _mm512_loadu_ps(og + 16 * c)));
      }
    }
  }
}

float silu(float v) { return v / (1.0f + std::exp(-v)); }

}  // namespace

struct CpuDecodeStep::Plan {
  struct Layer {
    const Bf16* input_norm = nullptr;  // [hidden]
    const Bf16* post_norm = nullptr;   // [hidden]
    Projection q, k, v, o;
    const Bf16* q_norm = nullptr;  // [head_dim] (qwen3) or null
    const Bf16* k_norm = nullptr;
    float attention_eps = 1e-6f;
    float scaling = 1.0f;
    // The MLP: a MoE block (routed on the plan's loops when `route_here`, else moe->forward), or
    // a dense gated MLP.
    const MoeBlock* moe = nullptr;
    bool route_here = false;
    const Bf16* router = nullptr;  // [experts, hidden]
    bool renormalise = false, round_weights = false;
    GatedProjections shared;  // qwen2_moe's shared expert, or undefined
    const Bf16* shared_gate =
        nullptr;  // qwen2_moe's [1, hidden] gate of the shared expert, or null
    GatedProjections dense;
  };

  const CausalLm* lm = nullptr;
  std::vector<Layer> layers;
  const Bf16* embed = nullptr;       // [vocab, hidden]
  const Bf16* final_norm = nullptr;  // [hidden]
  Projection head;                   // lm_head's kernel, or null kernel: at::linear below
  int64_t hidden = 0, vocab = 0, heads = 0, kv_heads = 0, head_dim = 0, experts = 0, top_k = 0;
  int64_t mlp_width = 0;  // the widest gate/up output of a dense MLP or shared expert
  float eps = 1e-6f;

  // Buffers, fp32 unless named: the residual stream and what one layer needs.
  std::vector<float> x, normed, q, k, v, context, proj, mlp_a, mlp_b, shared_out, scores,
      router_probs;
  std::vector<Bf16> expert_in, expert_out;  // the expert engine's bf16 activations
  std::vector<int32_t> expert_order, expert_ids;
  std::vector<float> expert_weights;

  void attention(const Layer& layer, LayerKvCache& cache, const float* cos, const float* sin,
                 int64_t past, int64_t capacity);
  void moe(const Layer& layer);
  void gatedMlp(const GatedProjections& mlp, const float* in, float* out);
  void libtorchMoe(const Layer& layer);
};

CpuDecodeStep::CpuDecodeStep(std::unique_ptr<Plan> plan) : plan_(std::move(plan)) {}
CpuDecodeStep::~CpuDecodeStep() = default;

std::unique_ptr<CpuDecodeStep> CpuDecodeStep::create(const CausalLm& lm, std::string* why_not) {
  auto refuse = [&](const std::string& why) -> std::unique_ptr<CpuDecodeStep> {
    if (why_not) *why_not = why;
    return nullptr;
  };
  const io::ModelConfig& config = lm.config_;
  if (lm.dtype_ != at::kBFloat16) return refuse("the model is not bf16");
  if (!lm.embed_device_.is_cpu() || !lm.head_device_.is_cpu()) return refuse("not on the CPU");
  for (const at::Device& device : lm.layer_devices_) {
    if (!device.is_cpu()) return refuse("a layer is not on the CPU");
  }
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  p.lm = &lm;
  p.hidden = config.hidden_size;
  p.vocab = config.vocab_size;
  p.eps = static_cast<float>(config.rms_norm_eps);
  if (!plainBf16(lm.embed_tokens, p.vocab * p.hidden)) return refuse("embeddings not plain bf16");
  if (!plainBf16(lm.final_norm, p.hidden)) return refuse("final norm not plain bf16");
  p.embed = bf16Data(lm.embed_tokens);
  p.final_norm = bf16Data(lm.final_norm);
  if (lm.lm_head_few_row_) {
    p.head = {nullptr, lm.lm_head_few_row_.get(), nullptr, p.hidden, p.vocab};
  } else {
    if (!plainBf16(lm.lm_head, p.vocab * p.hidden)) return refuse("lm_head not plain bf16");
    p.head = {nullptr, nullptr, nullptr, p.hidden, p.vocab};
  }
  for (const DecoderLayer& layer : lm.layers_) {
    if (!layer.gqa) return refuse("MLA attention");
    const gpu::GqaAttention& a = *layer.gqa;
    Plan::Layer l;
    if (p.layers.empty()) {
      p.heads = a.num_heads;
      p.kv_heads = a.num_kv_heads;
      p.head_dim = a.head_dim;
    } else if (a.num_heads != p.heads || a.num_kv_heads != p.kv_heads || a.head_dim != p.head_dim) {
      return refuse("layers of different attention shapes");
    }
    if (!plainBf16(layer.input_layernorm, p.hidden) ||
        !plainBf16(layer.post_attention_layernorm, p.hidden)) {
      return refuse("layer norms not plain bf16");
    }
    l.input_norm = bf16Data(layer.input_layernorm);
    l.post_norm = bf16Data(layer.post_attention_layernorm);
    l.q = projectionOf(a.q_proj);
    l.k = projectionOf(a.k_proj);
    l.v = projectionOf(a.v_proj);
    l.o = projectionOf(a.o_proj);
    if (a.q_norm.defined() != a.k_norm.defined()) return refuse("one of q_norm / k_norm");
    if (a.q_norm.defined()) {
      if (!plainBf16(a.q_norm, a.head_dim) || !plainBf16(a.k_norm, a.head_dim)) {
        return refuse("q/k norms not plain bf16");
      }
      l.q_norm = bf16Data(a.q_norm);
      l.k_norm = bf16Data(a.k_norm);
    }
    l.attention_eps = static_cast<float>(a.rms_norm_eps);
    l.scaling = static_cast<float>(a.scaling);
    if (layer.moe) {
      const MoeBlock& m = *layer.moe;
      l.moe = &m;
      const gpu::Router& r = m.router;
      const bool softmax_top_k =
          r.kind == gpu::RouterKind::QwenSoftmax || r.kind == gpu::RouterKind::MixtralSoftmax;
      l.route_here = m.experts && !m.offload && !m.split && m.resident_count == 0 &&
                     !m.lora_experts.defined() && !m.route_observer && softmax_top_k &&
                     !r.gate.hasLora() && r.gate.weight().dim() == 2 &&
                     plainBf16(r.gate.weight(), r.gate.weight().size(0) * p.hidden) &&
                     !r.gate.bias().defined() &&
                     (!m.shared_gate.defined() ||
                      (!m.shared_gate.hasLora() && !m.shared_gate.bias().defined() &&
                       plainBf16(m.shared_gate.weight(), p.hidden)));
      if (l.route_here) {
        l.router = bf16Data(r.gate.weight());
        p.experts = std::max<int64_t>(p.experts, r.gate.weight().size(0));
        p.top_k = std::max<int64_t>(p.top_k, r.top_k);
        l.renormalise = r.kind == gpu::RouterKind::MixtralSoftmax || r.norm_topk_prob;
        l.round_weights = r.kind == gpu::RouterKind::QwenSoftmax;
        l.shared = gatedOf(m.shared);
        if (m.shared_gate.defined()) l.shared_gate = bf16Data(m.shared_gate.weight());
        if (l.shared.defined) p.mlp_width = std::max(p.mlp_width, l.shared.gate.out);
      }
    } else {
      l.dense = gatedOf(layer.dense_mlp);
      if (!l.dense.defined) return refuse("a layer without an MLP");
      p.mlp_width = std::max(p.mlp_width, l.dense.gate.out);
    }
    p.layers.push_back(l);
  }
  if (lm.rope_.invFreq().numel() * 2 != p.head_dim) return refuse("rotary dims != head_dim");
  const int64_t q_width = p.heads * p.head_dim, kv_width = p.kv_heads * p.head_dim;
  auto sized = [](std::vector<float>& v, int64_t n) { v.assign(static_cast<size_t>(n), 0.0f); };
  sized(p.x, p.hidden);
  sized(p.normed, p.hidden);
  sized(p.q, q_width);
  sized(p.k, kv_width);
  sized(p.v, kv_width);
  sized(p.context, q_width);
  sized(p.proj, std::max(p.hidden, p.vocab));
  sized(p.mlp_a, p.mlp_width);
  sized(p.mlp_b, p.mlp_width);
  sized(p.shared_out, p.hidden);
  sized(p.router_probs, p.experts);
  p.expert_order.assign(static_cast<size_t>(p.experts), 0);
  p.expert_in.assign(static_cast<size_t>(p.hidden), 0);
  p.expert_out.assign(static_cast<size_t>(p.hidden), 0);
  p.expert_ids.assign(static_cast<size_t>(p.top_k), 0);
  p.expert_weights.assign(static_cast<size_t>(p.top_k), 0.0f);
  return std::unique_ptr<CpuDecodeStep>(new CpuDecodeStep(std::move(plan)));
}

bool CpuDecodeStep::takes(KvCache& cache) const {
  if (cache.batch() != 1 || cache.length() == 0 || cache.length() >= cache.capacity()) return false;
  const Plan& p = *plan_;
  const int64_t numel = p.kv_heads * cache.capacity() * p.head_dim;
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const LayerKvCache& c = cache.layer(i);
    if (!plainBf16(c.key, numel) || !plainBf16(c.value, numel)) return false;
  }
  return true;
}

std::vector<float> CpuDecodeStep::step(int32_t token, KvCache& cache) {
  Plan& p = *plan_;
  if (token < 0 || token >= p.vocab) {
    throw Error("token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                    std::to_string(p.vocab) + ")",
                "the tokens do not belong to this model's tokenizer");
  }
  if (!takes(cache)) {
    throw Error("the CPU decode step cannot continue this KV cache (empty, full or not batch 1)",
                "feed the prompt through CausalLm::forwardCached first");
  }
  const int64_t past = cache.length(), capacity = cache.capacity();
  gpu::RopeTables& rope = cache.rope(at::kCPU);  // all positions, filled by the prefill or here
  if (!rope.cos.defined()) rope = p.lm->rope_.tables(capacity, at::kCPU);
  const int64_t half = p.head_dim / 2;
  if (!rope.cos.is_contiguous() || rope.cos.scalar_type() != at::kFloat ||
      rope.cos.size(-1) != half) {
    throw Error("the KV cache's rope tables are not the CPU step's [capacity, head_dim / 2] fp32");
  }
  const float* cos = rope.cos.const_data_ptr<float>() + past * half;
  const float* sin = rope.sin.const_data_ptr<float>() + past * half;

  const Bf16* row = p.embed + static_cast<int64_t>(token) * p.hidden;
  for (int64_t i = 0; i < p.hidden; ++i) p.x[static_cast<size_t>(i)] = bf16ToFloat(row[i]);
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const Plan::Layer& layer = p.layers[i];
    rmsNorm(p.x.data(), layer.input_norm, p.hidden, p.eps, p.normed.data());
    p.attention(layer, cache.layer(i), cos, sin, past, capacity);
    for (int64_t j = 0; j < p.hidden; ++j)
      p.x[static_cast<size_t>(j)] += p.proj[static_cast<size_t>(j)];
    rmsNorm(p.x.data(), layer.post_norm, p.hidden, p.eps, p.normed.data());
    if (layer.moe) {
      p.moe(layer);
    } else {
      p.gatedMlp(layer.dense, p.normed.data(), p.proj.data());
    }
    for (int64_t j = 0; j < p.hidden; ++j)
      p.x[static_cast<size_t>(j)] += p.proj[static_cast<size_t>(j)];
  }
  cache.advance(1);
  rmsNorm(p.x.data(), p.final_norm, p.hidden, p.eps, p.normed.data());
  std::vector<float> logits(static_cast<size_t>(p.vocab));
  if (p.head.kernel) {
    p.head.kernel->forward(p.normed.data(), 1, logits.data());
  } else {
    at::Tensor h = at::from_blob(p.normed.data(), {1, p.hidden}, at::kFloat).to(at::kBFloat16);
    const at::Tensor y = at::linear(h, p.lm->lm_head).to(at::kFloat).contiguous();
    std::memcpy(logits.data(), y.const_data_ptr<float>(), logits.size() * sizeof(float));
  }
  return logits;
}

// normed [hidden] at position `past` -> proj [hidden] (after o_proj); writes the cache's slot.
void CpuDecodeStep::Plan::attention(const Layer& layer, LayerKvCache& cache, const float* cos,
                                    const float* sin, int64_t past, int64_t capacity) {
  layer.q(normed.data(), q.data());
  layer.k(normed.data(), k.data());
  layer.v(normed.data(), v.data());
  const int64_t half = head_dim / 2;
  // Per-head norm (qwen3), then rope on the halves of each head, as Rope::apply(Halves).
  auto rotate = [&](float* heads_data, int64_t n, const Bf16* norm) {
    for (int64_t h = 0; h < n; ++h) {
      float* t = heads_data + h * head_dim;
      if (norm) rmsNorm(t, norm, head_dim, layer.attention_eps, t);
      for (int64_t i = 0; i < half; ++i) {
        const float a = t[i], b = t[i + half];
        t[i] = a * cos[i] - b * sin[i];
        t[i + half] = b * cos[i] + a * sin[i];
      }
    }
  };
  rotate(q.data(), heads, layer.q_norm);
  rotate(k.data(), kv_heads, layer.k_norm);
  // The cache is [1, kv_heads, capacity, head_dim] bf16: this position's slot of each head.
  Bf16* keys = reinterpret_cast<Bf16*>(cache.key.data_ptr<c10::BFloat16>());
  Bf16* values = reinterpret_cast<Bf16*>(cache.value.data_ptr<c10::BFloat16>());
  for (int64_t h = 0; h < kv_heads; ++h) {
    for (int64_t d = 0; d < head_dim; ++d) {
      const int64_t at_slot = (h * capacity + past) * head_dim + d;
      keys[at_slot] = floatToBf16(k[static_cast<size_t>(h * head_dim + d)]);
      values[at_slot] = floatToBf16(v[static_cast<size_t>(h * head_dim + d)]);
    }
  }
  // Softmax attention over positions [0, past] in fp32 (as attendToCache), each query head
  // reading its key/value head's rows in place.
  const int64_t length = past + 1, groups = heads / kv_heads;
  if (hasAvx512() && head_dim % 16 == 0 && head_dim <= 256) {
    if (static_cast<int64_t>(scores.size()) < groups * length)
      scores.resize(static_cast<size_t>(groups * capacity));
    for (int64_t kv = 0; kv < kv_heads; ++kv) {
      attendGroupAvx512(q.data() + kv * groups * head_dim, groups, keys + kv * capacity * head_dim,
                        values + kv * capacity * head_dim, length, head_dim, layer.scaling,
                        scores.data(), context.data() + kv * groups * head_dim);
    }
    layer.o(context.data(), proj.data());
    return;
  }
  if (static_cast<int64_t>(scores.size()) < length) scores.resize(static_cast<size_t>(capacity));
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t kv = h / groups;
    const float* qh = q.data() + h * head_dim;
    const Bf16* key_rows = keys + kv * capacity * head_dim;
    const Bf16* value_rows = values + kv * capacity * head_dim;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < length; ++j) {
      const float s = dotBf16(qh, key_rows + j * head_dim, head_dim) * layer.scaling;
      scores[static_cast<size_t>(j)] = s;
      top = std::max(top, s);
    }
    float total = 0.0f;
    for (int64_t j = 0; j < length; ++j) {
      const float e = std::exp(scores[static_cast<size_t>(j)] - top);
      scores[static_cast<size_t>(j)] = e;
      total += e;
    }
    float* out = context.data() + h * head_dim;
    std::fill(out, out + head_dim, 0.0f);
    for (int64_t j = 0; j < length; ++j) {
      axpyBf16(scores[static_cast<size_t>(j)] / total, value_rows + j * head_dim, out, head_dim);
    }
  }
  layer.o(context.data(), proj.data());
}

void CpuDecodeStep::Plan::gatedMlp(const GatedProjections& mlp, const float* in, float* out) {
  mlp.gate(in, mlp_a.data());
  mlp.up(in, mlp_b.data());
  for (int64_t i = 0; i < mlp.gate.out; ++i) {
    mlp_a[static_cast<size_t>(i)] =
        silu(mlp_a[static_cast<size_t>(i)]) * mlp_b[static_cast<size_t>(i)];
  }
  mlp.down(mlp_a.data(), out);
}

// normed [hidden] -> proj [hidden]: softmax top-k routing as gpu::Router (routeQwen), the routed
// experts on the expert engine, plus the shared expert.
void CpuDecodeStep::Plan::moe(const Layer& layer) {
  if (!layer.route_here) return libtorchMoe(layer);
  const MoeBlock& m = *layer.moe;
  const int64_t n_experts = m.router.gate.weight().size(0);
  const int top = m.router.top_k;
  // The router's logits are a bf16 linear's output in libtorch: rounded to bf16 here too.
  float top_logit = -std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < n_experts; ++e) {
    const float logit =
        bf16ToFloat(floatToBf16(dotBf16(normed.data(), layer.router + e * hidden, hidden)));
    router_probs[static_cast<size_t>(e)] = logit;
    top_logit = std::max(top_logit, logit);
  }
  float total = 0.0f;
  for (int64_t e = 0; e < n_experts; ++e) {
    router_probs[static_cast<size_t>(e)] =
        std::exp(router_probs[static_cast<size_t>(e)] - top_logit);
    total += router_probs[static_cast<size_t>(e)];
  }
  for (int64_t e = 0; e < n_experts; ++e) router_probs[static_cast<size_t>(e)] /= total;
  std::vector<int32_t>& order = expert_order;
  std::iota(order.begin(), order.begin() + n_experts, 0);
  std::partial_sort(order.begin(), order.begin() + top, order.begin() + n_experts,
                    [&](int32_t a, int32_t b) {
                      const float pa = router_probs[static_cast<size_t>(a)],
                                  pb = router_probs[static_cast<size_t>(b)];
                      return pa > pb || (pa == pb && a < b);
                    });
  float chosen = 0.0f;
  for (int j = 0; j < top; ++j)
    chosen += router_probs[static_cast<size_t>(order[static_cast<size_t>(j)])];
  for (int j = 0; j < top; ++j) {
    const int32_t e = order[static_cast<size_t>(j)];
    float w = router_probs[static_cast<size_t>(e)];
    if (layer.renormalise) w /= chosen;
    if (layer.round_weights) w = bf16ToFloat(floatToBf16(w));
    expert_ids[static_cast<size_t>(j)] = e;
    expert_weights[static_cast<size_t>(j)] = w;
  }
  m.pairs.routed += top;
  // The engine takes the model dtype's activations, as routedExperts gives it.
  floatToBf16(normed, expert_in);
  m.experts->forward(expert_in.data(), experts::ActivationType::BF16, 1, expert_ids.data(),
                     expert_weights.data(), top, expert_out.data(), nullptr);
  bf16ToFloat(expert_out, std::span<float>(proj.data(), static_cast<size_t>(hidden)));
  if (!layer.shared.defined) return;
  gatedMlp(layer.shared, normed.data(), shared_out.data());
  // qwen2_moe: sigmoid(shared_expert_gate(x)) scales the shared expert's output.
  const float gate =
      layer.shared_gate
          ? 1.0f / (1.0f + std::exp(-dotBf16(normed.data(), layer.shared_gate, hidden)))
          : 1.0f;
  for (int64_t i = 0; i < hidden; ++i) {
    proj[static_cast<size_t>(i)] += gate * shared_out[static_cast<size_t>(i)];
  }
}

// The block's own forward on the normed row rounded to bf16 (offload, split, resident or LoRA
// experts, other routers).
void CpuDecodeStep::Plan::libtorchMoe(const Layer& layer) {
  const at::Tensor in = at::from_blob(normed.data(), {1, 1, hidden}, at::kFloat).to(at::kBFloat16);
  const at::Tensor out = layer.moe->forward(in, false).to(at::kFloat).contiguous();
  std::memcpy(proj.data(), out.const_data_ptr<float>(),
              static_cast<size_t>(hidden) * sizeof(float));
}

}  // namespace tandem::model
