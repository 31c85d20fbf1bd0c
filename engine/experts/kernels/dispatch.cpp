// Which fp32 table runs: the dispatch over the tables the ISA files export (expert_kernels.h).

#include "engine/core/cpu_features.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {
// The widest fp32 table the CPU allows: the LoRA table of the fast backends, and the fp32
// backend (plain_gemm.cpp names each after its table) that auto keeps f32 / f16 weights on.
const ExpertKernels& bestFp32Kernels(const CpuFeatures& features) {
#ifdef TANDEM_EXPERTS_HAVE_AVX512
  if (features.canUseAvx512()) return avx512Kernels();
#endif
#ifdef TANDEM_EXPERTS_HAVE_AVX2
  if (features.canUseAvx2()) return avx2Kernels();
#endif
  (void)features;
  return genericKernels();
}
}  // namespace

const ExpertKernels& loraKernels(std::string_view backend, const CpuFeatures& features) {
  const ExpertKernels& generic = genericKernels();
  return backend == generic.name ? generic : bestFp32Kernels(features);
}

const char* bestFp32Backend(const CpuFeatures& features) { return bestFp32Kernels(features).name; }

}  // namespace tandem::experts::kernels
