#pragma once
// The vector kernel tables this build has, for the tests that hold each one to ref:: (skipped,
// with a message, where the CPU or TANDEM_CPU_ISA does not allow the table).

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels::testing {

struct VectorTable {
  const ExpertKernels* kernels;
  bool usable;  // this CPU, under the cap, may run it
};

inline std::vector<std::string> vectorTableNames() {
  return {
#ifdef TANDEM_EXPERTS_HAVE_AVX512
      "avx512",
#endif
#ifdef TANDEM_EXPERTS_HAVE_AVX2
      "avx2",
#endif
  };
}

// Test names: the table's.
inline std::string vectorTableName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

inline VectorTable vectorTable(const std::string& name) {
#ifdef TANDEM_EXPERTS_HAVE_AVX512
  if (name == "avx512") return {&avx512Kernels(), cpuFeatures().canUseAvx512()};
#endif
#ifdef TANDEM_EXPERTS_HAVE_AVX2
  if (name == "avx2") return {&avx2Kernels(), cpuFeatures().canUseAvx2()};
#endif
  ADD_FAILURE() << "no kernel table " << name;
  return {&genericKernels(), false};
}

// A fixture over every table: GetParam() is its name, kernels() the table, skipped when unusable.
class VectorKernelsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    table_ = vectorTable(GetParam());
    if (!table_.usable)
      GTEST_SKIP() << "no " << GetParam() << " here (or capped by TANDEM_CPU_ISA)";
  }
  const ExpertKernels& kernels() const { return *table_.kernels; }

 private:
  VectorTable table_{};
};

}  // namespace tandem::experts::kernels::testing
