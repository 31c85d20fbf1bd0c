#include "engine/core/cpu_features.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <thread>

#include "engine/core/error.h"
#include "engine/core/platform/amx_permission.h"
#include "engine/core/platform/cpu_affinity.h"

namespace tandem {

namespace {

constexpr uint64_t kXcr0Avx = (1u << 1) | (1u << 2);                 // SSE + AVX state
constexpr uint64_t kXcr0Avx512 = (1u << 5) | (1u << 6) | (1u << 7);  // opmask, ZMM_Hi256, Hi16_ZMM
constexpr uint64_t kXcr0Amx = (1u << 17) | (1u << 18);               // XTILECFG + XTILEDATA

struct CpuidRegs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuidRegs cpuid(unsigned leaf, unsigned subleaf) {
  CpuidRegs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) return {};
  return r;
}

bool bit(unsigned value, int index) { return (value >> index) & 1u; }

uint64_t readXcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

std::string cpuidString(const unsigned* regs, int count) {
  std::string s(reinterpret_cast<const char*>(regs), count * sizeof(unsigned));
  s.erase(s.find_last_not_of(std::string(" \0", 2)) + 1);
  s.erase(0, s.find_first_not_of(' '));
  return s;
}

void readIdentity(CpuFeatures& f) {
  const CpuidRegs v = cpuid(0, 0);
  const unsigned vendor[3] = {v.ebx, v.edx, v.ecx};
  f.vendor = cpuidString(vendor, 3);
  if (cpuid(0x80000000u, 0).eax >= 0x80000004u) {
    unsigned brand[12];
    for (unsigned i = 0; i < 3; ++i) {
      const CpuidRegs r = cpuid(0x80000002u + i, 0);
      brand[i * 4 + 0] = r.eax;
      brand[i * 4 + 1] = r.ebx;
      brand[i * 4 + 2] = r.ecx;
      brand[i * 4 + 3] = r.edx;
    }
    f.brand = cpuidString(brand, 12);
  }
  const size_t allowed = platform::allowedCpuIds().size();
  f.logical_cpus = allowed > 0 ? static_cast<int>(allowed)
                               : static_cast<int>(std::thread::hardware_concurrency());
}

void readFeatureBits(CpuFeatures& f) {
  const unsigned max_leaf = cpuid(0, 0).eax;
  const CpuidRegs l1 = cpuid(1, 0);
  f.fma = bit(l1.ecx, 12);
  f.f16c = bit(l1.ecx, 29);
  const bool osxsave = bit(l1.ecx, 27);
  if (max_leaf >= 7) {
    const CpuidRegs l7 = cpuid(7, 0);
    f.avx2 = bit(l7.ebx, 5);
    f.avx512f = bit(l7.ebx, 16);
    f.avx512dq = bit(l7.ebx, 17);
    f.avx512bw = bit(l7.ebx, 30);
    f.avx512vl = bit(l7.ebx, 31);
    f.avx512_vnni = bit(l7.ecx, 11);
    f.amx_bf16 = bit(l7.edx, 22);
    f.avx512_fp16 = bit(l7.edx, 23);
    f.amx_tile = bit(l7.edx, 24);
    f.amx_int8 = bit(l7.edx, 25);
    if (l7.eax >= 1) f.avx512_bf16 = bit(cpuid(7, 1).eax, 5);
  }
  if (osxsave) {
    const uint64_t xcr0 = readXcr0();
    f.os_avx = (xcr0 & kXcr0Avx) == kXcr0Avx;
    f.os_avx512 = f.os_avx && (xcr0 & kXcr0Avx512) == kXcr0Avx512;
    f.os_amx = (xcr0 & kXcr0Amx) == kXcr0Amx;
  }
}

// Asks the OS for the AMX tile state (platform/amx_permission.h): Linux >= 5.16 requires this
// before the first tile instruction; without it the instruction faults.
void requestAmxPermission(CpuFeatures& f) {
  if (!f.amx_tile) {
    f.amx_status = "not supported by this CPU";
    return;
  }
  if (!f.os_amx) {
    f.amx_status = "the OS does not enable the AMX register state (XCR0)";
    return;
  }
  const platform::AmxPermission permission = platform::requestAmxTileState();
  if (!permission.granted) {
    f.amx_status = permission.refusal;
    return;
  }
  f.amx_permitted = true;
  f.amx_status = "usable";
}

IsaLevel capFromEnvironment() {
  const char* value = std::getenv("TANDEM_CPU_ISA");
  return (value && *value) ? parseIsaLevel(value) : IsaLevel::Amx;
}

}  // namespace

std::string_view isaLevelName(IsaLevel level) {
  switch (level) {
    case IsaLevel::Generic: return "generic";
    case IsaLevel::Avx2: return "avx2";
    case IsaLevel::Avx512: return "avx512";
    case IsaLevel::Avx512Bf16: return "avx512_bf16";
    case IsaLevel::Amx: return "amx";
  }
  return "?";
}

IsaLevel parseIsaLevel(std::string_view name) {
  for (IsaLevel level :
       {IsaLevel::Generic, IsaLevel::Avx2, IsaLevel::Avx512, IsaLevel::Avx512Bf16, IsaLevel::Amx}) {
    if (name == isaLevelName(level)) return level;
  }
  throw Error("unknown instruction-set level '" + std::string(name) + "' (TANDEM_CPU_ISA)",
              "use one of: generic, avx2, avx512, avx512_bf16, amx");
}

bool CpuFeatures::canUseAvx2() const {
  return cap >= IsaLevel::Avx2 && avx2 && fma && f16c && os_avx;
}
bool CpuFeatures::canUseAvx512() const {
  return cap >= IsaLevel::Avx512 && canUseAvx2() && avx512f && avx512bw && avx512vl && avx512dq &&
         os_avx512;
}
bool CpuFeatures::canUseAvx512Bf16() const {
  return cap >= IsaLevel::Avx512Bf16 && canUseAvx512() && avx512_bf16;
}
bool CpuFeatures::canUseAvx512Fp16() const {
  return cap >= IsaLevel::Avx512Bf16 && canUseAvx512() && avx512_fp16;
}
bool CpuFeatures::canUseAmxBf16() const {
  return cap >= IsaLevel::Amx && canUseAvx512() && amx_tile && amx_bf16 && amx_permitted;
}
bool CpuFeatures::canUseAmxInt8() const {
  return cap >= IsaLevel::Amx && canUseAvx512() && amx_tile && amx_int8 && amx_permitted;
}

IsaLevel CpuFeatures::bestLevel() const {
  if (canUseAmxBf16()) return IsaLevel::Amx;
  if (canUseAvx512Bf16()) return IsaLevel::Avx512Bf16;
  if (canUseAvx512()) return IsaLevel::Avx512;
  if (canUseAvx2()) return IsaLevel::Avx2;
  return IsaLevel::Generic;
}

CpuFeatures detectCpuFeatures(IsaLevel cap) {
  CpuFeatures f;
  f.cap = cap;
  readIdentity(f);
  readFeatureBits(f);
  if (cap >= IsaLevel::Amx) {
    requestAmxPermission(f);
  } else {
    f.amx_status = std::string("disabled by TANDEM_CPU_ISA=") + std::string(isaLevelName(cap));
  }
  return f;
}

const CpuFeatures& cpuFeatures() {
  static const CpuFeatures features = detectCpuFeatures(capFromEnvironment());
  return features;
}

}  // namespace tandem
