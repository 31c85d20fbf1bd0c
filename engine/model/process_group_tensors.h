#pragma once
// The tensor side of ProcessGroup, for engine/model's own torch code (lora_training.cpp).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "engine/model/process_group.h"

namespace tandem::model {

// Sums every tensor over all ranks, in place. Large contiguous CPU fp32 tensors (the expert
// engine's LoRA gradient buffers) are reduced where they lie; the rest travel in flat fp32
// buckets of up to 25 MiB (GPU tensors through host copies), all queued before the first wait.
// `what` names the exchange in the error if a peer fails during it.
void allReduceSumTensors(ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                         const std::string& what);

}  // namespace tandem::model
