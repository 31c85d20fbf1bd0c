#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels {

namespace {
constexpr ExpertKernels kGeneric{"generic", ref::matmulNT, ref::matmulNN, ref::matmulTN};
#ifdef TANDEM_EXPERTS_HAVE_AVX512
constexpr ExpertKernels kAvx512{"avx512", avx512::matmulNT, avx512::matmulNN, avx512::matmulTN};
#endif

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}
}  // namespace

std::vector<std::string> availableBackends(const CpuFeatures& features) {
  std::vector<std::string> names;
#ifdef TANDEM_EXPERTS_HAVE_AVX512
  if (features.canUseAvx512()) names.emplace_back(kAvx512.name);
#else
  (void)features;
#endif
  names.emplace_back(kGeneric.name);
  return names;
}

const ExpertKernels& selectKernels(std::string_view backend, const CpuFeatures& features) {
  const std::vector<std::string> available = availableBackends(features);
  const std::string_view chosen = backend == "auto" ? std::string_view(available.front()) : backend;
#ifdef TANDEM_EXPERTS_HAVE_AVX512
  if (chosen == kAvx512.name && features.canUseAvx512()) return kAvx512;
#endif
  if (chosen == kGeneric.name) return kGeneric;
  throw Error("expert backend '" + std::string(backend) + "' is not available on this machine",
              "use one of: auto, " + joined(available) +
                  " (TANDEM_CPU_ISA may cap what is available)");
}

}  // namespace tandem::experts::kernels
