// libFuzzer target for parseModelConfig: the input is a config.json. A config that parses must
// keep the promises the engine relies on (positive sizes, top-k within the experts).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/error.h"
#include "engine/io/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const tandem::io::ModelConfig c = tandem::io::parseModelConfig(text, "fuzz-input");
    const bool valid = c.hidden_size > 0 && c.num_hidden_layers > 0 && c.num_attention_heads > 0 &&
                       c.num_key_value_heads > 0 && c.head_dim > 0 && c.vocab_size > 0 &&
                       c.num_attention_heads % c.num_key_value_heads == 0 &&
                       c.num_experts_per_tok <= c.num_experts;
    if (!valid) __builtin_trap();
    // What every consumer asks first; visits each layer, so bounded by num_hidden_layers.
    if (c.num_hidden_layers <= 4096) c.numMoeLayers();
  } catch (const tandem::Error&) {
    // Rejected config: the expected outcome for most inputs.
  }
  return 0;
}
