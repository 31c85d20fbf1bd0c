#pragma once
// placement::Device and ModelDType as libtorch sees them (engine/model only: the one place where
// the typed, torch-free values of ModelOptions become torch's).

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "engine/model/model_options.h"
#include "engine/placement/device.h"

namespace tandem::model {

// cuda:N -> torch's cuda:N, checked against the GPUs libtorch sees (an Error that says which
// exist); cpu -> cpu; cpu:numaK -> torch's cpu:K, a device object of its own, so layers on
// different NUMA nodes (or the CPU-only build's two "devices") take the multi-device paths.
c10::Device torchDevice(placement::Device device);
// The inverse, for reporting where a model's tensors ended up.
placement::Device placementDevice(c10::Device device);

c10::ScalarType torchDtype(ModelDType dtype);

}  // namespace tandem::model
