#include "ui/machine_info.h"

#include <QObject>

#include "engine/core/units.h"

namespace tandem::ui {

uint64_t MachineInfo::totalGpuBytes() const {
  uint64_t total = 0;
  for (const gpu::GpuInfo& g : torch.gpus) total += g.total_bytes;
  return total;
}

MachineInfo detectMachine() {
  MachineInfo m;
  m.cpu = cpuFeatures();
  m.numa = detectNumaTopology();
  m.torch = gpu::probeTorchRuntime();
  return m;
}

QString bytesText(uint64_t bytes) { return QString::fromStdString(formatBytes(bytes)); }

QString cpuIsaSummary(const CpuFeatures& cpu) {
  QStringList usable;
  if (cpu.canUseAmxBf16()) usable << QStringLiteral("AMX-BF16");
  if (cpu.canUseAmxInt8()) usable << QStringLiteral("AMX-INT8");
  if (cpu.canUseAvx512Bf16())
    usable << QStringLiteral("AVX-512 BF16");
  else if (cpu.canUseAvx512())
    usable << QStringLiteral("AVX-512");
  if (cpu.canUseAvx2()) usable << QStringLiteral("AVX2");
  QString text =
      usable.isEmpty() ? QObject::tr("generic kernels only") : usable.join(QStringLiteral(", "));
  if (cpu.amx_tile && !cpu.amx_permitted && !cpu.amx_status.empty()) {
    text += QObject::tr(" — AMX not usable: %1").arg(QString::fromStdString(cpu.amx_status));
  }
  return text;
}

QStringList describeMachine(const MachineInfo& machine) {
  QStringList lines;
  for (const gpu::GpuInfo& g : machine.torch.gpus) {
    lines << QObject::tr("GPU cuda:%1  %2  %3 (%4 free)")
                 .arg(g.index)
                 .arg(QString::fromStdString(g.name), bytesText(g.total_bytes),
                      bytesText(g.free_bytes));
  }
  if (machine.torch.gpus.empty()) {
    lines << QObject::tr("No GPU: %1").arg(QString::fromStdString(machine.torch.gpu_status));
  }
  lines << QObject::tr("CPU  %1, %2 logical CPUs")
               .arg(QString::fromStdString(machine.cpu.brand))
               .arg(machine.cpu.logical_cpus);
  lines << QObject::tr("     kernels: %1").arg(cpuIsaSummary(machine.cpu));
  for (const NumaNode& n : machine.numa.nodes) {
    lines << QObject::tr("NUMA node %1  %2 CPUs  %3 RAM (%4 free)")
                 .arg(n.id)
                 .arg(n.cpus.size())
                 .arg(bytesText(n.total_bytes), bytesText(n.free_bytes));
  }
  return lines;
}

}  // namespace tandem::ui
