// Wizard page 2: the hardware. The detected machine (GPUs with memory, CPU with the AVX-512 /
// AMX state, NUMA nodes with RAM), the device for the dense part, and the expert engine's
// backend, weight format, backward Wᵀ policy, GPU-resident experts and threads (the
// KTransformers kt_backend / kt_expert_weight_format / kt_num_gpu_experts / kt_num_threads
// settings).

#include <QComboBox>
#include <QFormLayout>
#include <QLabel>
#include <QSpinBox>
#include <QVBoxLayout>
#include <optional>
#include <string>

#include "engine/core/error.h"
#include "engine/placement/hardware.h"
#include "ui/error_text.h"
#include "ui/host_machine.h"
#include "ui/machine_info.h"
#include "ui/wizard_pages.h"

namespace tandem::ui {

namespace {

int comboIndexOf(QComboBox* combo, const QString& data) {
  const int i = combo->findData(data);
  return i >= 0 ? i : 0;
}

QString backendToolTip(const QString& usable_kernels) {
  return HardwarePage::tr(
             "experts_backend (KTransformers kt_backend): the CPU kernels of the routed experts; "
             "auto picks the best this CPU allows (%1)")
      .arg(usable_kernels);
}

}  // namespace

HardwarePage::HardwarePage(FineTuneWizard& wizard) : wizard_(wizard) {
  setTitle(tr("Hardware"));
  setSubTitle(
      tr("Where the run goes: attention and dense layers on the device below, routed experts on "
         "the CPU "
         "(the most routed also on the GPU while it has room)."));
  target_ = new QComboBox;
  target_->addItem(tr("This machine"), QString());
  for (const std::filesystem::path& file :
       placement::listHardwarePresets(wizard_.paths().presets / "hardware")) {
    target_->addItem(tr("Preset: %1").arg(QString::fromStdString(file.stem().string())),
                     QString::fromStdString(file.string()));
  }
  target_->setToolTip(
      tr("Plan for the machine the studio runs on, or for a preset in presets/hardware/ "
         "(the memory plan and placement then assume that machine; training still runs here)"));
  problem_ = makeProblemLabel();
  connect(target_, &QComboBox::currentIndexChanged, this, &HardwarePage::choosePreset);
  machine_text_ = new QLabel(tr("Probing this machine…"));
  machine_text_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  machine_text_->setStyleSheet(QStringLiteral("font-family: monospace;"));
  device_ = new QComboBox;
  fillDevices();
  device_->setToolTip(tr("device: where attention, router, shared experts and the LM head run"));
  backend_ = new QComboBox;
  for (const char* name :
       {"auto", "generic", "avx2", "avx512", "avx512_bf16", "amx_bf16", "amx_int8", "onednn"}) {
    backend_->addItem(QString::fromLatin1(name), QString::fromLatin1(name));
  }
  backend_->setToolTip(backendToolTip(tr("this machine is being probed")));
  format_ = new QComboBox;
  for (const char* name : {"auto", "bf16", "int8", "fp8"})
    format_->addItem(QString::fromLatin1(name), QString::fromLatin1(name));
  format_->setToolTip(
      tr("experts_format (kt_expert_weight_format): how the frozen routed experts are held in RAM "
         "and on the GPU; int8 halves them (per-channel int8, amx_int8; the GPU then holds about "
         "twice as many), fp8 keeps an fp8 checkpoint's experts (dequantised into bf16 packs); "
         "auto: int8 for amx_int8, else bf16"));
  wt_policy_ = new QComboBox;
  for (const char* name : {"auto", "persistent", "on_demand", "background"}) {
    wt_policy_->addItem(QString::fromLatin1(name), QString::fromLatin1(name));
  }
  wt_policy_->setToolTip(
      tr("experts_wt_policy: the backward's transposed expert weights. persistent keeps a second "
         "copy (twice the expert RAM, no per-step cost); on_demand rebuilds those of the routed "
         "experts each step; background builds the next layer's while the GPU works; auto: "
         "persistent when the memory plan has room, else background"));
  experts_mode_ = new QComboBox;
  experts_mode_->addItem(tr("cpu: co-computation (the CPU computes what the GPU does not hold)"),
                         QStringLiteral("cpu"));
  experts_mode_->addItem(tr("gpu-offload: stream what the GPU does not hold from RAM"),
                         QStringLiteral("gpu-offload"));
  experts_mode_->addItem(tr("auto: per step, each expert resident, streamed or on the CPU"),
                         QStringLiteral("auto"));
  experts_mode_->setToolTip(
      tr("experts_mode: who computes the routed experts the GPU does not keep. cpu: the CPU "
         "expert engine (fast CPUs with AMX); gpu-offload: their weights are copied to the GPU "
         "per layer and computed there (fast PCIe links). The memory plan's note estimates both "
         "for this machine and says when gpu-offload is the faster"));
  gpu_experts_ = new QSpinBox;
  gpu_experts_->setRange(-1, 4096);  // -1 shows as auto
  gpu_experts_->setSpecialValueText(tr("auto (what the GPU has left)"));
  gpu_experts_->setToolTip(
      tr("gpu_experts (kt_num_gpu_experts): routed experts per MoE layer kept on the layer's GPU "
         "and computed there while the CPU computes the others, or (gpu-offload) while the others "
         "stream in (the most routed of the first step); auto: as many as the memory plan fits; "
         "0: none"));
  threads_ = new QSpinBox;
  threads_->setRange(0, 4096);
  threads_->setSpecialValueText(tr("one per physical core"));
  threads_->setToolTip(
      tr("expert_threads (kt_num_threads): CPU threads of the expert engine; 0 = one per core"));

  device_->setObjectName(QStringLiteral("device"));
  backend_->setObjectName(QStringLiteral("experts_backend"));
  format_->setObjectName(QStringLiteral("experts_format"));
  wt_policy_->setObjectName(QStringLiteral("experts_wt_policy"));
  experts_mode_->setObjectName(QStringLiteral("experts_mode"));
  gpu_experts_->setObjectName(QStringLiteral("gpu_experts"));
  threads_->setObjectName(QStringLiteral("expert_threads"));
  auto* form = new QFormLayout;
  form->addRow(tr("&Plan for:"), target_);
  form->addRow(tr("&Dense-part device:"), device_);
  form->addRow(tr("&Experts backend:"), backend_);
  form->addRow(tr("Experts &format:"), format_);
  form->addRow(tr("Backward &Wᵀ:"), wt_policy_);
  form->addRow(tr("Experts &mode:"), experts_mode_);
  form->addRow(tr("Experts on the &GPU:"), gpu_experts_);
  form->addRow(tr("Expert &threads:"), threads_);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(new QLabel(tr("<b>Machine</b>")));
  layout->addWidget(machine_text_);
  layout->addSpacing(10);
  layout->addLayout(form);
  layout->addWidget(problem_);
  layout->addStretch(1);

  connect(&wizard_.host(), &HostMachine::probed, this, &HardwarePage::showProbe);
  connect(&wizard_, &FineTuneWizard::modelSummaryChanged, this, &HardwarePage::limitGpuExperts);
  if (wizard_.host().isProbed()) showProbe();
}

bool HardwarePage::isComplete() const { return problem_->text().isEmpty(); }

void HardwarePage::initializePage() { limitGpuExperts(); }

void HardwarePage::limitGpuExperts() {
  // A layer has no more experts to keep on the GPU than the chosen model has (the engine would
  // cap a larger count anyway).
  const std::optional<io::ModelSummary>& summary = wizard_.modelSummary();
  if (summary && summary->config.num_experts > 0)
    gpu_experts_->setMaximum(summary->config.num_experts);
}

void HardwarePage::fillDevices() {
  const QString chosen = device_->currentData().toString();
  device_->clear();
  device_->addItem(tr("auto (first GPU, else CPU)"), QStringLiteral("auto"));
  device_->addItem(tr("CPU only"), QStringLiteral("cpu"));
  for (const gpu::GpuInfo& g : wizard_.machine().torch.gpus) {
    device_->addItem(
        QStringLiteral("cuda:%1 — %2").arg(g.index).arg(QString::fromStdString(g.name)),
        QStringLiteral("cuda:%1").arg(g.index));
  }
  selectDevice(chosen.isEmpty() ? QStringLiteral("auto") : chosen);
}

void HardwarePage::selectDevice(const QString& device) {
  int i = device_->findData(device);
  if (i < 0) {
    device_->addItem(device, device);  // e.g. cuda:3 from a config written on another machine
    i = device_->count() - 1;
  }
  device_->setCurrentIndex(i);
}

void HardwarePage::showProbe() {
  fillDevices();
  backend_->setToolTip(backendToolTip(cpuIsaSummary(wizard_.machine().cpu)));
  if (!target_->currentData().toString().isEmpty()) return;  // a preset is chosen
  const HostMachine& host = wizard_.host();
  machine_text_->setText(describeMachine(host.info()).join(QLatin1Char('\n')));
  showProblem(problem_, host.problem());
  wizard_.setHardware(host.hardware());
  emit completeChanged();
}

void HardwarePage::choosePreset() {
  const QString file = target_->currentData().toString();
  try {
    if (file.isEmpty()) {
      // The last probe until a fresh one (free memory changes) arrives.
      wizard_.setHardware(wizard_.host().hardware());
      machine_text_->setText(tr("Probing this machine…"));
      wizard_.host().probe();
    } else {
      const placement::Hardware h = placement::loadHardwarePreset(file.toStdString());
      QStringList lines;
      for (const placement::GpuSpec& g : h.gpus) {
        lines << tr("GPU %1  %2  %3")
                     .arg(QString::fromStdString(g.device().str()), QString::fromStdString(g.name),
                          bytesText(g.total_bytes));
      }
      lines << tr("CPU  %1, %2 socket(s), %3 cores%4")
                   .arg(QString::fromStdString(h.cpu.name))
                   .arg(h.cpu.sockets)
                   .arg(h.cpu.physical_cores)
                   .arg(h.cpu.amx_bf16      ? tr(", AMX")
                        : h.cpu.avx512_bf16 ? tr(", AVX-512 BF16")
                                            : QString());
      for (const placement::NumaNodeSpec& n : h.numa_nodes) {
        lines << tr("NUMA node %1  %2 cores  %3 RAM")
                     .arg(n.id)
                     .arg(n.cores)
                     .arg(bytesText(n.total_bytes));
      }
      machine_text_->setText(lines.join(QLatin1Char('\n')));
      wizard_.setHardware(h);
    }
    showProblem(problem_, {});
  } catch (const Error& e) {
    showProblem(problem_, errorText(e));
  }
  emit completeChanged();
}

void HardwarePage::load(const train::TrainConfig& config) {
  selectDevice(QString::fromStdString(config.device));
  backend_->setCurrentIndex(comboIndexOf(backend_, QString::fromStdString(config.experts_backend)));
  format_->setCurrentIndex(comboIndexOf(format_, QString::fromStdString(config.experts_format)));
  wt_policy_->setCurrentIndex(
      comboIndexOf(wt_policy_, QString::fromStdString(config.experts_wt_policy)));
  experts_mode_->setCurrentIndex(
      comboIndexOf(experts_mode_, QString::fromStdString(config.experts_mode)));
  // The config was validated when it was read: auto or a count.
  gpu_experts_->setValue(config.gpu_experts == "auto" ? -1 : std::stoi(config.gpu_experts));
  threads_->setValue(config.expert_threads);
}

void HardwarePage::store(train::TrainConfig& config) const {
  config.device = device_->currentData().toString().toStdString();
  config.experts_backend = backend_->currentData().toString().toStdString();
  config.experts_format = format_->currentData().toString().toStdString();
  config.experts_wt_policy = wt_policy_->currentData().toString().toStdString();
  config.experts_mode = experts_mode_->currentData().toString().toStdString();
  config.gpu_experts = gpu_experts_->value() < 0 ? "auto" : std::to_string(gpu_experts_->value());
  config.expert_threads = threads_->value();
}

}  // namespace tandem::ui
