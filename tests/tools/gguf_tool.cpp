// gguf_tool: Tandem's GGUF reader and writer driven from the command line, for the parity test
// against the PyPI `gguf` package (tests/parity/test_gguf_reference.py).
//
//   gguf_tool dump FILE.gguf OUT.json            header, metadata and tensor list as JSON
//   gguf_tool dequant FILE.gguf OUT.safetensors  every dequantizable tensor as F32, torch shape
//   gguf_tool copy IN.gguf OUT.gguf              re-write with writeGguf (same metadata, tensors,
//                                                alignment)
// Exit status: 0 on success, 1 on a tandem::Error (printed), 2 on bad usage.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/error.h"
#include "engine/io/atomic_file.h"
#include "engine/io/gguf.h"
#include "engine/io/safetensors.h"

namespace {

using nlohmann::ordered_json;
using tandem::io::GgufFile;
using tandem::io::GgufTensorInfo;
using tandem::io::GgufValue;
using tandem::io::GgufValueType;

// JSON has no NaN or infinity; they are written as the strings Python's float() parses.
ordered_json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

ordered_json valueJson(const GgufValue& value) {
  ordered_json out;
  std::visit(
      [&](const auto& held) {
        using T = std::decay_t<decltype(held)>;
        if constexpr (std::is_same_v<T, double>) {
          out = number(held);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          out = ordered_json::array();
          for (double v : held) out.push_back(number(v));
        } else {
          out = held;
        }
      },
      value.value);
  return out;
}

void dump(const GgufFile& file, const char* out_path) {
  const tandem::io::GgufHeader& header = file.header();
  ordered_json root;
  root["version"] = header.version;
  root["alignment"] = header.alignment;
  root["data_offset"] = header.data_offset;
  ordered_json metadata = ordered_json::object();
  for (const auto& [key, value] : header.metadata) {
    ordered_json entry;
    entry["type"] = tandem::io::ggufValueTypeName(value.type);
    if (value.type == GgufValueType::Array)
      entry["element_type"] = tandem::io::ggufValueTypeName(value.element_type);
    entry["value"] = valueJson(value);
    metadata[key] = std::move(entry);
  }
  root["metadata"] = std::move(metadata);
  ordered_json tensors = ordered_json::array();
  for (const GgufTensorInfo& t : header.tensors) {
    tensors.push_back({{"name", t.name},
                       {"type", tandem::io::ggmlTypeName(t.type)},
                       {"ne", t.ne},
                       {"offset", t.offset},
                       {"byte_size", t.byte_size}});
  }
  root["tensors"] = std::move(tensors);
  // String values are raw bytes in GGUF; invalid UTF-8 is replaced rather than refused.
  const std::string text = root.dump(1, ' ', false, ordered_json::error_handler_t::replace) + "\n";
  tandem::io::writeFileAtomically(out_path, text);
}

bool dequantizable(const GgufTensorInfo& t) {
  return tandem::io::ggmlTypeTraits(static_cast<uint32_t>(t.type))->dequantizable;
}

void dequant(const GgufFile& file, const char* out_path) {
  const std::vector<GgufTensorInfo>& infos = file.header().tensors;
  // Reserved up front so that the views below stay valid while the list grows.
  std::vector<std::vector<float>> values;
  values.reserve(static_cast<size_t>(std::count_if(infos.begin(), infos.end(), dequantizable)));
  std::vector<tandem::io::TensorToWrite> tensors;
  for (const GgufTensorInfo& t : infos) {
    if (!dequantizable(t)) {
      std::fprintf(stderr, "skipped %s: %s has no dequantizer\n", t.name.c_str(),
                   std::string(tandem::io::ggmlTypeName(t.type)).c_str());
      continue;
    }
    const std::vector<float>& data = values.emplace_back(file.dequantize(t));
    tensors.push_back(
        {t.name,
         tandem::io::DType::F32,
         t.torchShape(),
         {reinterpret_cast<const std::byte*>(data.data()), data.size() * sizeof(float)}});
  }
  tandem::io::writeSafetensors(out_path, tensors);
  std::printf("dequantized %zu of %zu tensors to %s\n", tensors.size(), infos.size(), out_path);
}

void copy(const GgufFile& file, const char* out_path) {
  std::vector<tandem::io::GgufTensorToWrite> tensors;
  for (const GgufTensorInfo& t : file.header().tensors)
    tensors.push_back({t.name, t.type, t.ne, file.tensorBytes(t)});
  tandem::io::writeGguf(out_path, file.header().metadata, tensors, file.header().alignment);
  std::printf("copied %zu tensors and %zu keys to %s\n", tensors.size(),
              file.header().metadata.size(), out_path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s dump|dequant|copy IN.gguf OUT\n", argv[0]);
    return 2;
  }
  const std::string_view command = argv[1];
  if (command != "dump" && command != "dequant" && command != "copy") {
    std::fprintf(stderr, "unknown command \"%s\" (expected dump, dequant or copy)\n", argv[1]);
    return 2;
  }
  try {
    const GgufFile file = GgufFile::open(argv[2]);
    if (command == "dump") dump(file, argv[3]);
    if (command == "dequant") dequant(file, argv[3]);
    if (command == "copy") copy(file, argv[3]);
    return 0;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.message().c_str());
    if (!e.whatToDo().empty()) std::fprintf(stderr, "  %s\n", e.whatToDo().c_str());
    return 1;
  }
}
