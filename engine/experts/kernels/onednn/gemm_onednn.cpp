// Backend onednn: oneDNN's bf16 matmul primitive on weights reordered once, at pack time, into the
// layout oneDNN picks (format "any"). M is a runtime dimension, so one primitive serves every row
// block. Inside the layer it runs on the pool's workers, one single-threaded oneDNN call per task
// (OpenMP teams of one on those threads: oneDNN's own threads on top would oversubscribe), with a
// user-managed scratchpad in the thread's arena so concurrent calls never share one.

#include <omp.h>

#include <chrono>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/core/float_convert.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// oneDNN picks its own ISA; TANDEM_CPU_ISA caps it too (before the first primitive), so a capped
// run never executes an instruction the cap forbids, in our kernels or in oneDNN's.
dnnl::cpu_isa maxIsa(IsaLevel cap) {
  switch (cap) {
    case IsaLevel::Generic: return dnnl::cpu_isa::sse41;
    case IsaLevel::Avx2: return dnnl::cpu_isa::avx2;
    case IsaLevel::Avx512: return dnnl::cpu_isa::avx512_core;
    case IsaLevel::Avx512Bf16: return dnnl::cpu_isa::avx512_core_bf16;
    case IsaLevel::Amx: break;
  }
  return dnnl::cpu_isa::all;
}

dnnl::engine& cpuEngine() {
  static dnnl::engine engine = [] {
    dnnl::set_max_cpu_isa(maxIsa(cpuFeatures().cap));
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

// c [M, n] f32 (ldc runtime) = a [M, k] bf16 (lda runtime) · weights [k, n] bf16 (+ c if sum).
dnnl::matmul::primitive_desc matmulDesc(int64_t n, int64_t k, bool accumulate) {
  constexpr int64_t kRt = DNNL_RUNTIME_DIM_VAL;
  const dnnl::memory::desc src({kRt, k}, dt::bf16, dnnl::memory::dims{kRt, 1});
  const dnnl::memory::desc weights({k, n}, dt::bf16, tag::any);
  const dnnl::memory::desc dst({kRt, n}, dt::f32, dnnl::memory::dims{kRt, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, cpuEngine());
}

class OnednnMatrix final : public PackedMatrix {
 public:
  OnednnMatrix(int64_t n, int64_t k)
      : PackedMatrix(n, k),
        set_desc(matmulDesc(n, k, false)),
        add_desc(matmulDesc(n, k, true)),
        set(set_desc),
        add(add_desc),
        weights(set_desc.weights_desc(), cpuEngine()) {}
  uint64_t bytes() const override { return weights.get_desc().get_size(); }

  dnnl::matmul::primitive_desc set_desc, add_desc;
  dnnl::matmul set, add;
  dnnl::memory weights;  // in set_desc's layout (add_desc picks the same: same shapes and types)
};

void toBf16(const float* a, int64_t lda, int64_t m, int64_t k, uint16_t* out) {
  for (int64_t i = 0; i < m; ++i) {
    floatToBf16(std::span<const float>(a + i * lda, k), std::span<uint16_t>(out + i * k, k));
  }
}

class OnednnGemm final : public GemmBackend {
 public:
  const char* name() const override { return "onednn"; }
  bool supports(WeightFormat format) const override { return format == WeightFormat::Bf16; }
  int64_t rowBlock() const override { return 128; }

  std::unique_ptr<PackedMatrix> pack(const SourceMatrix& src, bool transpose, WeightFormat,
                                     int) const override {
    const DequantisedB b(src, transpose);
    const int64_t n = b.n(), k = b.k();
    // weights [k, n] bf16 plain: W [n, k] row-major is its "ba" form, Wᵀ its "ab" form.
    std::vector<uint16_t> bits(b.w().size());
    floatToBf16(std::span<const float>(b.w()), std::span<uint16_t>(bits));
    auto packed = std::make_unique<OnednnMatrix>(n, k);
    const dnnl::memory::desc plain({k, n}, dt::bf16, transpose ? tag::ab : tag::ba);
    dnnl::memory source(plain, cpuEngine(), bits.data());
    dnnl::stream stream(cpuEngine());
    dnnl::reorder(source, packed->weights).execute(stream, source, packed->weights);
    stream.wait();
    return packed;
  }

  void gemm(const PackedMatrix& packed, int64_t m, const float* a, int64_t lda, float* c,
            int64_t ldc, bool accumulate, const LowRankAddend* addend) const override {
    if (m <= 0 || packed.n() <= 0) return;
    thread_local bool single_threaded = [] {
      omp_set_num_threads(1);
      return true;
    }();
    (void)single_threaded;
    const auto& b = static_cast<const OnednnMatrix&>(packed);
    auto* a_bits = static_cast<uint16_t*>(threadArena(0, static_cast<size_t>(m * b.k()) * 2));
    toBf16(a, lda, m, b.k(), a_bits);
    const dnnl::matmul::primitive_desc& desc = accumulate ? b.add_desc : b.set_desc;
    const dnnl::memory::desc src_md({m, b.k()}, dt::bf16, dnnl::memory::dims{b.k(), 1});
    const dnnl::memory::desc dst_md({m, b.n()}, dt::f32, dnnl::memory::dims{ldc, 1});
    const dnnl::memory::desc pad_md = desc.scratchpad_desc();
    dnnl::engine& engine = cpuEngine();
    dnnl::memory src(src_md, engine, a_bits), dst(dst_md, engine, c);
    dnnl::memory scratch(pad_md, engine, threadArena(1, pad_md.get_size() + 64));
    dnnl::stream stream(engine);
    (accumulate ? b.add : b.set)
        .execute(stream, {{DNNL_ARG_SRC, src},
                          {DNNL_ARG_WEIGHTS, b.weights},
                          {DNNL_ARG_DST, dst},
                          {DNNL_ARG_SCRATCHPAD, scratch}});
    stream.wait();
    if (addend) {  // oneDNN's epilogue is not ours: a pass of the fp32 table after it
      loraKernels(name(), cpuFeatures())
          .matmulNN(m, b.n(), addend->rank, 1.0f, addend->z, addend->ldz, addend->bt,
                    WeightType::F32, addend->ldb, c, ldc, true);
    }
  }
};

}  // namespace

const GemmBackend* onednnGemm() {
  static const OnednnGemm backend;
  return &backend;
}

double onednnSquareGemmTflops(int64_t size, int threads, int repeats) {
  // Below AVX-512 oneDNN has no bf16 matmul (it refuses the descriptor): no ceiling of its own.
  if (!cpuFeatures().canUseAvx512()) return 0.0;
  omp_set_num_threads(threads);
  const dnnl::memory::desc a_md({size, size}, dt::bf16, tag::ab);
  const dnnl::memory::desc b_md({size, size}, dt::bf16, tag::any);
  const dnnl::memory::desc c_md({size, size}, dt::f32, tag::ab);
  const dnnl::matmul::primitive_desc desc(dnnl::matmul::desc(a_md, b_md, c_md), cpuEngine());
  dnnl::memory a(a_md, cpuEngine()), b(desc.weights_desc(), cpuEngine()), c(c_md, cpuEngine());
  std::memset(a.get_data_handle(), 0x3f, a_md.get_size());  // bf16 0x3f3f ≈ 0.75
  std::memset(b.get_data_handle(), 0x3f, desc.weights_desc().get_size());
  dnnl::matmul matmul(desc);
  dnnl::stream stream(cpuEngine());
  const auto run = [&] {
    matmul.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  };
  run();  // warm-up: JIT and first touch
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(size) * size * size / best / 1e12;
}

}  // namespace tandem::experts::kernels
