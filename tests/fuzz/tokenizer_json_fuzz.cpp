// libFuzzer target for Tokenizer::fromJson: the input is a tokenizer.json. A tokenizer that loads
// must encode and decode without crashing; only tandem::Error may escape, anything else (a crash,
// a sanitizer finding, another exception, a huge allocation) is a bug.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/core/error.h"
#include "engine/io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const tandem::io::Tokenizer tokenizer = tandem::io::Tokenizer::fromJson(text, {}, "fuzz-input");
    for (std::string_view sample : {"Hello world, 12345!\n", " \u00e9\u65e5\u672c <s> ab"}) {
      const std::vector<int32_t> ids = tokenizer.encode(sample, /*add_special_tokens=*/true);
      // Every id an encode gives is one the tokenizer knows (decode throws Error otherwise).
      for (int32_t id : ids)
        if (id < 0 || id >= tokenizer.vocabSize()) __builtin_trap();
      tokenizer.decode(ids, /*skip_special_tokens=*/true);
    }
  } catch (const tandem::Error&) {
    // Rejected tokenizer, or ids it cannot decode: expected for most inputs.
  }
  return 0;
}
