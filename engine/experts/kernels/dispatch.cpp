#include "engine/core/cpu_features.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {
constexpr ExpertKernels kGeneric{"generic",    ref::matmulNT,     ref::matmulNN,
                                 ref::matmulTN, ref::siluMul,       ref::siluBackward,
                                 ref::axpy,     ref::widenBf16};
#ifdef TANDEM_EXPERTS_HAVE_AVX512
constexpr ExpertKernels kAvx512{"avx512",         avx512::matmulNT, avx512::matmulNN,
                                avx512::matmulTN, avx512::siluMul,  avx512::siluBackward,
                                avx512::axpy,     avx512::widenBf16};
#endif
#ifdef TANDEM_EXPERTS_HAVE_AVX2
constexpr ExpertKernels kAvx2{"avx2",         avx2::matmulNT, avx2::matmulNN,
                              avx2::matmulTN, avx2::siluMul,  avx2::siluBackward,
                              avx2::axpy,     avx2::widenBf16};
#endif
}  // namespace

const ExpertKernels& genericKernels() { return kGeneric; }
#ifdef TANDEM_EXPERTS_HAVE_AVX512
const ExpertKernels& avx512Kernels() { return kAvx512; }
#endif
#ifdef TANDEM_EXPERTS_HAVE_AVX2
const ExpertKernels& avx2Kernels() { return kAvx2; }
#endif

namespace {
// The widest fp32 table the CPU allows: the LoRA table of the fast backends, and the fp32
// backend (plain_gemm.cpp names each after its table) that auto keeps f32 / f16 weights on.
const ExpertKernels& bestFp32Kernels(const CpuFeatures& features) {
#ifdef TANDEM_EXPERTS_HAVE_AVX512
  if (features.canUseAvx512()) return kAvx512;
#endif
#ifdef TANDEM_EXPERTS_HAVE_AVX2
  if (features.canUseAvx2()) return kAvx2;
#endif
  (void)features;
  return kGeneric;
}
}  // namespace

const ExpertKernels& loraKernels(std::string_view backend, const CpuFeatures& features) {
  return backend == kGeneric.name ? kGeneric : bestFp32Kernels(features);
}

const char* bestFp32Backend(const CpuFeatures& features) { return bestFp32Kernels(features).name; }

}  // namespace tandem::experts::kernels
