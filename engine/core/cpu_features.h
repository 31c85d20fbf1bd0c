#pragma once
// What the CPU can do and what the OS lets us use, detected once per process.
//
// A feature is usable only when the CPU reports it, the OS saves its register state (XCR0), and
// for AMX the kernel granted this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM,
// requested once, here, never per call). TANDEM_CPU_ISA=generic|avx2|avx512|avx512_bf16|amx caps
// what the kernels may use, so fallbacks can be tested on a machine that has everything.

#include <string>
#include <string_view>

namespace tandem {

enum class IsaLevel { Generic = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3, Amx = 4 };

std::string_view isaLevelName(IsaLevel level);
IsaLevel parseIsaLevel(std::string_view name);  // throws Error listing the allowed names

struct CpuFeatures {
  std::string vendor;
  std::string brand;
  int logical_cpus = 1;  // CPUs this process may run on (affinity mask)

  // As reported by CPUID.
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;

  // Register state the OS saves on context switch (XCR0).
  bool os_avx = false, os_avx512 = false, os_amx = false;

  // AMX: whether this process may use the tiles, and if not, why (for `tandem info`).
  bool amx_permitted = false;
  std::string amx_status;

  IsaLevel cap = IsaLevel::Amx;  // from TANDEM_CPU_ISA

  // What kernels may use: CPU support, OS support, permission and the cap together.
  bool canUseAvx2() const;
  bool canUseAvx512() const;  // F + BW + VL + DQ
  bool canUseAvx512Bf16() const;
  bool canUseAvx512Fp16() const;
  bool canUseAmxBf16() const;
  bool canUseAmxInt8() const;
  IsaLevel bestLevel() const;
};

// Detected once (first call requests the AMX permission if the cap allows AMX).
const CpuFeatures& cpuFeatures();

// Detection with an explicit cap; requests AMX permission only when cap allows AMX.
CpuFeatures detectCpuFeatures(IsaLevel cap);

}  // namespace tandem
