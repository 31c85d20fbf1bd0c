#include <dlfcn.h>

#include "engine/core/platform/gpu_telemetry.h"
#include "engine/core/platform/nvml_api.h"

namespace tandem::platform {

std::vector<GpuTelemetry> readGpuTelemetry() {
  static const nvml::Api api = nvml::load([](const char* symbol) -> void* {
    static void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    return library != nullptr ? dlsym(library, symbol) : nullptr;
  });
  return nvml::read(api);
}

}  // namespace tandem::platform
