#include "engine/io/dtype.h"

#include <array>

namespace tandem::io {

namespace {

struct DTypeTraits {
  DType dtype;
  std::string_view name;
  size_t size_bytes;
};

// Names as the safetensors format spells them; "BOOL" is one byte per element there.
constexpr std::array<DTypeTraits, 15> kDTypes{{
    {DType::F64, "F64", 8},
    {DType::F32, "F32", 4},
    {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::I64, "I64", 8},
    {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},
    {DType::I8, "I8", 1},
    {DType::U64, "U64", 8},
    {DType::U32, "U32", 4},
    {DType::U16, "U16", 2},
    {DType::U8, "U8", 1},
    {DType::Bool, "BOOL", 1},
}};

const DTypeTraits& traits(DType dtype) {
  // The table is in enum order, checked once at compile time below.
  return kDTypes[static_cast<size_t>(dtype)];
}

constexpr bool tableInEnumOrder() {
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(tableInEnumOrder(), "kDTypes must list the DType enumerators in order");

}  // namespace

size_t dtypeSize(DType dtype) { return traits(dtype).size_bytes; }

std::string_view dtypeName(DType dtype) { return traits(dtype).name; }

std::optional<DType> parseDType(std::string_view name) {
  for (const DTypeTraits& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

}  // namespace tandem::io
