#include "engine/model/peft_adapter.h"

#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/platform/process_info.h"
#include "engine/io/safetensors.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;

// An adapter dir whose one tensor has the given name.
fs::path adapterWithTensor(const std::string& tensor_name) {
  const fs::path dir = fs::temp_directory_path() /
                       ("tandem_peft_adapter_" + std::to_string(platform::currentProcessId()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "adapter_config.json") << R"({"peft_type": "LORA", "r": 1})";
  const float value = 1;
  const io::TensorToWrite tensor{
      tensor_name, io::DType::F32, {1, 1}, {reinterpret_cast<const std::byte*>(&value), 4}};
  io::writeSafetensors(dir / "adapter_model.safetensors", std::span(&tensor, 1));
  return dir;
}

TEST(PeftAdapter, OverlongTensorNameIsAnErrorNotAStackOverflow) {
  // std::regex_match recursed once per digit of the layer number: SIGSEGV at 100k digits.
  const fs::path dir = adapterWithTensor("base_model.model.model.layers." +
                                         std::string(100000, '1') + ".mlp.experts.lora_A.weight");
  try {
    readPeftAdapter(dir, io::ModelConfig{});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("longer than any LoRA weight's name"), std::string::npos)
        << e.what();
    EXPECT_LT(std::string(e.what()).size(), 1000u);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::model

namespace tandem::model {
namespace {

TEST(PeftAdapter, FusedExpertLoraOnADenseModelIsAnError) {
  // A dense model: hidden 4, no experts. The fused pairs fit its shapes (gate_up [r, 2*0] and
  // [4, r*E], down [r, 4] and [0, r*E]) and were then split by dividing by the expert count, 0:
  // SIGFPE.
  const fs::path dir =
      adapterWithTensor("base_model.model.model.layers.0.mlp.experts.lora_A.weight");
  const std::string layer = "base_model.model.model.layers.0.mlp.experts.";
  const float values[4] = {1, 1, 1, 1};
  const std::span<const std::byte> four(reinterpret_cast<const std::byte*>(values), 16);
  const std::vector<io::TensorToWrite> tensors = {
      {layer + "base_layer.lora_A.weight", io::DType::F32, {1, 0}, {}},
      {layer + "base_layer.lora_B.weight", io::DType::F32, {4, 1}, four},
      {layer + "lora_A.weight", io::DType::F32, {1, 4}, four},
      {layer + "lora_B.weight", io::DType::F32, {0, 1}, {}}};
  io::writeSafetensors(dir / "adapter_model.safetensors", tensors);
  io::ModelConfig dense;
  dense.hidden_size = 4;
  try {
    readPeftAdapter(dir, dense);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no routed experts"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::model
