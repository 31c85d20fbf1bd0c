#include "engine/core/cpu_features.h"
#include "engine/experts/kernels/expert_kernels.h"

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
}  // namespace

const ExpertKernels& genericKernels() { return kGeneric; }
#ifdef TANDEM_EXPERTS_HAVE_AVX512
const ExpertKernels& avx512Kernels() { return kAvx512; }
#endif

const ExpertKernels& loraKernels(std::string_view backend, const CpuFeatures& features) {
#ifdef TANDEM_EXPERTS_HAVE_AVX512
  if (backend != kGeneric.name && features.canUseAvx512()) return kAvx512;
#else
  (void)backend;
  (void)features;
#endif
  return kGeneric;
}

}  // namespace tandem::experts::kernels
