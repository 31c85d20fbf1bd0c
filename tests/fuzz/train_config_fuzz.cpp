// libFuzzer target for parseTrainConfig: the input is a LLaMA-Factory training YAML. A config that
// parses must survive toYaml and parse back to the same fingerprint (what resume relies on).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/error.h"
#include "engine/train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const tandem::train::TrainConfig config = tandem::train::parseTrainConfig(text, "fuzz-input");
    const std::string yaml = tandem::train::toYaml(config);
    const tandem::train::TrainConfig again = tandem::train::parseTrainConfig(yaml, "toYaml");
    if (tandem::train::configFingerprint(again) != tandem::train::configFingerprint(config))
      __builtin_trap();
  } catch (const tandem::Error&) {
    // Rejected config: the expected outcome for most inputs.
  }
  return 0;
}
