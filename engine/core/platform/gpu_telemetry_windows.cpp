#include <windows.h>

#include "engine/core/platform/gpu_telemetry.h"
#include "engine/core/platform/nvml_api.h"

namespace tandem::platform {

std::vector<GpuTelemetry> readGpuTelemetry() {
  static const nvml::Api api = nvml::load([](const char* symbol) -> void* {
    static HMODULE library = LoadLibraryW(L"nvml.dll");
    return library != nullptr ? reinterpret_cast<void*>(GetProcAddress(library, symbol)) : nullptr;
  });
  return nvml::read(api);
}

}  // namespace tandem::platform
