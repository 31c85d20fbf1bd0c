#pragma once
// For tests outside engine/model: a PEFT adapter with non-zero LoRA for a model dir, written
// without the test seeing libtorch. Fresh adapters have B = 0 (PEFT's init), which would make an
// adapted model answer exactly like its base.

#include <cstdint>
#include <filesystem>

#include "engine/model/lora_plan.h"

namespace tandem::model::testing {

// Loads `model_dir` with `plan`'s adapters, sets every dense LoRA B to N(0, dense_b_std) (seeded)
// and every routed expert's LoRA B to `expert_b`, and writes the adapter (PEFT's fused form) to
// `out_dir`.
void writeRandomAdapter(const std::filesystem::path& model_dir,
                        const std::filesystem::path& out_dir, const LoraPlan& plan, uint64_t seed,
                        double dense_b_std, float expert_b);

}  // namespace tandem::model::testing
