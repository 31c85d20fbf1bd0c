#include "engine/placement/expert_format.h"

#include <array>

#include "engine/core/error.h"

namespace tandem::placement {
namespace {

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

ExpertFormat plain(std::string name, int64_t bytes) {
  ExpertFormat f;
  f.name = std::move(name);
  f.block_bytes = bytes;
  return f;
}

ExpertFormat blocks(std::string name, int64_t weights, int64_t bytes) {
  ExpertFormat f;
  f.name = std::move(name);
  f.block_weights = weights;
  f.block_bytes = bytes;
  f.computed_as_stored = true;
  return f;
}

// 4-bit values (weights / 2 bytes) + a 16-bit scale (+ a 16-bit minimum when asymmetric).
ExpertFormat int4(int64_t group, bool symmetric) {
  return blocks(int4FormatName(group, symmetric), group, group / 2 + (symmetric ? 2 : 4));
}

std::vector<ExpertFormat> allFormats() {
  ExpertFormat int8 = plain("int8", 1);
  int8.row_scales = true;
  ExpertFormat fp8 = plain("fp8", 1);
  fp8.fp8_block_scales = true;
  std::vector<ExpertFormat> all = {plain("bf16", 2), plain("fp16", 2), plain("fp32", 4), int8, fp8};
  for (bool symmetric : {true, false}) {
    for (int64_t group : {32, 64, 128}) all.push_back(int4(group, symmetric));
  }
  // ggml's block structs (ggml-common.h): block_q8_0 {f16 d; int8 qs[32]}, block_q4_0 {f16 d;
  // uint8 qs[16]}, block_q4_K {f16 d, dmin; uint8 scales[12]; uint8 qs[128]}, block_q5_K (+
  // qh[32]), block_q6_K {uint8 ql[128], qh[64]; int8 scales[16]; f16 d}, block_iq4_xs {f16 d;
  // uint16 scales_h; uint8 scales_l[4]; uint8 qs[128]}, block_mxfp4 {uint8 e; uint8 qs[16]}.
  all.push_back(blocks("q8_0", 32, 34));
  all.push_back(blocks("q4_0", 32, 18));
  all.push_back(blocks("q4_k", 256, 144));
  all.push_back(blocks("q5_k", 256, 176));
  all.push_back(blocks("q6_k", 256, 210));
  all.push_back(blocks("iq4_xs", 256, 136));
  all.push_back(blocks("mxfp4", 32, 17));
  return all;
}

const std::vector<ExpertFormat>& formats() {
  static const std::vector<ExpertFormat> all = allFormats();
  return all;
}

}  // namespace

uint64_t ExpertFormat::matrixBytes(int64_t rows, int64_t cols) const {
  auto bytes = static_cast<uint64_t>(rows * ceilDiv(cols, block_weights) * block_bytes);
  if (row_scales) bytes += static_cast<uint64_t>(rows) * 4;
  if (fp8_block_scales) bytes += static_cast<uint64_t>(ceilDiv(rows, 128) * ceilDiv(cols, 128)) * 4;
  return bytes;
}

double ExpertFormat::bitsPerWeight() const {
  return 8.0 * static_cast<double>(block_bytes) / static_cast<double>(block_weights);
}

ExpertFormat expertFormat(std::string_view name) {
  for (const ExpertFormat& f : formats()) {
    if (f.name == name) return f;
  }
  std::string names;
  for (const std::string& n : expertFormatNames()) names += (names.empty() ? "" : ", ") + n;
  throw Error("'" + std::string(name) + "' is not an expert weight format", "use one of " + names);
}

bool isExpertFormat(std::string_view name) {
  for (const ExpertFormat& f : formats()) {
    if (f.name == name) return true;
  }
  return false;
}

std::vector<std::string> expertFormatNames() {
  std::vector<std::string> names;
  for (const ExpertFormat& f : formats()) names.push_back(f.name);
  return names;
}

std::string int4FormatName(int64_t group_size, bool symmetric) {
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    throw Error("int4 group size " + std::to_string(group_size) + " is not supported",
                "use 32, 64 or 128");
  }
  std::string name = "int4";
  if (group_size != 32) name += ":g" + std::to_string(group_size);
  return symmetric ? name : name + ":asym";
}

}  // namespace tandem::placement
