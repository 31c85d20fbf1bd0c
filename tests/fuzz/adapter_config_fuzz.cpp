// libFuzzer target for parsePeftAdapterConfig: the input is an adapter_config.json.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/core/error.h"
#include "engine/model/peft_adapter_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const tandem::model::PeftAdapterConfig c =
        tandem::model::parsePeftAdapterConfig(text, "fuzz-input");
    const bool valid = c.rank >= 1 && c.rank <= tandem::model::kMaxAdapterRank &&
                       std::isfinite(c.alpha) && c.dropout >= 0 && c.dropout <= 1 &&
                       std::isfinite(c.alphaFor("mlp.experts.gate_up_proj"));
    if (!valid) __builtin_trap();
  } catch (const tandem::Error&) {
    // Rejected config: the expected outcome for most inputs.
  }
  return 0;
}
