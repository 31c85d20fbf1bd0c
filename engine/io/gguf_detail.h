#pragma once
// Helpers shared by gguf_header.cpp (the reader) and gguf.cpp (the writer and the typed getters),
// so that the writer refuses exactly what the reader would refuse. Not part of the gguf.h API.

#include <string_view>

#include "engine/io/gguf.h"

namespace tandem::io::gguf_detail {

inline constexpr std::string_view kAlignmentKey = "general.alignment";
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr size_t kMaxDims = 4;  // GGML_MAX_DIMS

bool isIntegerType(GgufValueType type);
bool isFloatType(GgufValueType type);
// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
bool isValidUtf8(std::string_view text);

}  // namespace tandem::io::gguf_detail
