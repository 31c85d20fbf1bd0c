#pragma once
// The element types that model files carry, with safetensors' names ("BF16", "F8_E4M3", ...).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem::io {

enum class DType : uint8_t {
  F64,
  F32,
  F16,
  BF16,
  F8_E4M3,
  F8_E5M2,
  I64,
  I32,
  I16,
  I8,
  U64,
  U32,
  U16,
  U8,
  Bool
};

size_t dtypeSize(DType dtype);                           // bytes per element
std::string_view dtypeName(DType dtype);                 // safetensors spelling, e.g. "BF16"
std::optional<DType> parseDType(std::string_view name);  // nullopt for unknown names

}  // namespace tandem::io
