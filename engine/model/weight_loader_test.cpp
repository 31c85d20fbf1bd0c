// WeightLoader on DeepSeek-V3-style fp8 checkpoints: dequantisation against the written-out
// definition (W[o][i] = fp8[o][i] · scale_inv[o / 128][i / 128], with e4m3 decoded by the engine's
// own bit-level converter), and an Error that says what is wrong for every broken checkpoint.

#include "engine/model/weight_loader.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/io/safetensors.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;

// A weight of 200 × 300 (both dimensions end in a partial block) with its [2, 3] scales.
constexpr int64_t kRows = 200, kCols = 300, kBlockRows = 2, kBlockCols = 3;

struct Checkpoint {
  std::vector<uint8_t> codes = std::vector<uint8_t>(kRows * kCols);
  std::vector<float> scales = std::vector<float>(kBlockRows * kBlockCols);

  Checkpoint() {
    std::mt19937 rng(7);
    for (uint8_t& c : codes) {
      do c = static_cast<uint8_t>(rng());
      while ((c & 0x7f) == 0x7f);  // no NaN codes
    }
    for (size_t b = 0; b < scales.size(); ++b) scales[b] = 0.001f * static_cast<float>(b + 1);
  }

  // Writes dir/model.safetensors with "w.weight" and its scales (shape `scale_shape`, stored as
  // `scale_dtype`; none when the shape is empty).
  fs::path write(const std::string& name, const std::vector<int64_t>& scale_shape,
                 io::DType scale_dtype = io::DType::F32) const {
    const fs::path dir = fs::temp_directory_path() / ("tandem_weight_loader_test_" + name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::vector<io::TensorToWrite> tensors;
    tensors.push_back({"w.weight",
                       io::DType::F8_E4M3,
                       {kRows, kCols},
                       {reinterpret_cast<const std::byte*>(codes.data()), codes.size()}});
    std::vector<std::byte> scale_bytes;
    if (!scale_shape.empty()) {
      const size_t n = static_cast<size_t>(scale_shape[0] * scale_shape[1]);
      scale_bytes.resize(n * io::dtypeSize(scale_dtype));
      for (size_t k = 0; k < n; ++k) {
        const float s = scales[k % scales.size()];
        if (scale_dtype == io::DType::BF16) {
          const uint16_t bits = floatToBf16(s);
          std::memcpy(scale_bytes.data() + 2 * k, &bits, 2);
        } else if (scale_dtype == io::DType::I32) {
          const int32_t value = static_cast<int32_t>(k);
          std::memcpy(scale_bytes.data() + 4 * k, &value, 4);
        } else {
          std::memcpy(scale_bytes.data() + 4 * k, &s, 4);
        }
      }
      tensors.push_back({"w.weight_scale_inv", scale_dtype, scale_shape, scale_bytes});
    }
    io::writeSafetensors(dir / "model.safetensors", tensors);
    return dir;
  }
};

// config.json's quantization_config as DeepSeek-V3 ships it.
const io::QuantizationConfig kDeepseek{"fp8", "e4m3", "dynamic", {128, 128}};

// The message of the Error `f` throws ("" when it throws none).
template <class F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(WeightLoaderFp8, DequantisesEveryBlockIncludingThePartialEdges) {
  const Checkpoint c;
  const fs::path dir = c.write("ok", {kBlockRows, kBlockCols});
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const WeightLoader loader(dir, dtype, at::kCPU, kDeepseek);
    EXPECT_TRUE(loader.isFp8("w.weight"));
    const at::Tensor w = loader.load("w.weight", {kRows, kCols}).to(at::kFloat);
    ASSERT_EQ(w.scalar_type(), at::kFloat);
    const float* got = w.data_ptr<float>();
    int64_t bad = 0;
    for (int64_t o = 0; o < kRows; ++o) {
      for (int64_t i = 0; i < kCols; ++i) {
        const float expected =
            fp8E4M3ToFloat(c.codes[o * kCols + i]) * c.scales[(o / 128) * kBlockCols + i / 128];
        const float rounded =
            dtype == at::kBFloat16 ? bf16ToFloat(floatToBf16(expected)) : expected;
        if (got[o * kCols + i] != rounded && bad++ < 5) {
          ADD_FAILURE() << "dtype " << c10::toString(dtype) << " [" << o << ", " << i
                        << "]: " << got[o * kCols + i] << " != " << rounded;
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
  const WeightLoader loader(dir, at::kFloat, at::kCPU, kDeepseek);
  const at::Tensor scales = loader.blockScales("w.weight", {kRows, kCols});
  EXPECT_EQ(scales.sizes().vec(), (std::vector<int64_t>{kBlockRows, kBlockCols}));
  EXPECT_EQ(scales.data_ptr<float>()[5], c.scales[5]);
}

TEST(WeightLoaderFp8, ScalesInBf16AreWidened) {
  Checkpoint c;
  for (float& s : c.scales) s = bf16ToFloat(floatToBf16(s));
  const fs::path dir = c.write("bf16_scales", {kBlockRows, kBlockCols}, io::DType::BF16);
  const WeightLoader loader(dir, at::kFloat, at::kCPU, kDeepseek);
  const at::Tensor scales = loader.blockScales("w.weight", {kRows, kCols});
  ASSERT_EQ(scales.scalar_type(), at::kFloat);
  for (size_t k = 0; k < c.scales.size(); ++k)
    EXPECT_EQ(scales.data_ptr<float>()[k], c.scales[k]) << k;
}

TEST(WeightLoaderFp8, MissingScalesSayWhich) {
  const fs::path dir = Checkpoint().write("missing", {});
  const WeightLoader loader(dir, at::kFloat, at::kCPU, kDeepseek);
  const std::string message = errorOf([&] { loader.load("w.weight", {kRows, kCols}); });
  EXPECT_NE(message.find("w.weight_scale_inv"), std::string::npos) << message;
  EXPECT_NE(message.find("are missing"), std::string::npos) << message;
}

TEST(WeightLoaderFp8, ScalesOfAnotherShapeSayWhatIsExpected) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{1, 2}, std::vector<int64_t>{3, 2}, std::vector<int64_t>{2, 2}}) {
    const fs::path dir = Checkpoint().write("shape", shape);
    const WeightLoader loader(dir, at::kFloat, at::kCPU, kDeepseek);
    const std::string message = errorOf([&] { loader.blockScales("w.weight", {kRows, kCols}); });
    EXPECT_NE(message.find("needs [2, 3]"), std::string::npos) << message;
  }
}

TEST(WeightLoaderFp8, ScalesOfAnIntegerTypeAreRefused) {
  const fs::path dir = Checkpoint().write("int_scales", {kBlockRows, kBlockCols}, io::DType::I32);
  const WeightLoader loader(dir, at::kFloat, at::kCPU, kDeepseek);
  const std::string message = errorOf([&] { loader.load("w.weight", {kRows, kCols}); });
  EXPECT_NE(message.find("w.weight_scale_inv is stored as I32"), std::string::npos) << message;
}

TEST(WeightLoaderFp8, Fp8WithoutQuantizationConfigIsExplained) {
  const fs::path dir = Checkpoint().write("no_config", {kBlockRows, kBlockCols});
  const WeightLoader loader(dir, at::kFloat, at::kCPU, std::nullopt);
  const std::string message = errorOf([&] { loader.load("w.weight", {kRows, kCols}); });
  EXPECT_NE(message.find("F8_E4M3"), std::string::npos) << message;
  EXPECT_NE(message.find("no quantization_config"), std::string::npos) << message;
}

TEST(WeightLoaderFp8, UnsupportedQuantizationIsRefusedBeforeLoading) {
  const fs::path dir = Checkpoint().write("unsupported", {kBlockRows, kBlockCols});
  const std::pair<io::QuantizationConfig, std::string> cases[] = {
      {{"gptq", "", "", {}}, "quant_method 'gptq'"},
      {{"fp8", "e5m2", "dynamic", {128, 128}}, "fmt 'e5m2'"},
      {{"fp8", "e4m3", "dynamic", {64, 64}}, "weight_block_size [64, 64]"},
      {{"fp8", "e4m3", "dynamic", {128, 64}}, "weight_block_size [128, 64]"},
  };
  for (const auto& [config, expected] : cases) {
    const std::string message = errorOf([&] { WeightLoader(dir, at::kFloat, at::kCPU, config); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
  // Absent fmt and block size mean e4m3 and [128, 128], as transformers' FineGrainedFP8Config.
  const WeightLoader loader(dir, at::kFloat, at::kCPU, io::QuantizationConfig{"fp8", "", "", {}});
  EXPECT_EQ(loader.load("w.weight", {kRows, kCols}).size(0), kRows);
}

TEST(WeightLoaderFp8, DequantizeFp8BlocksMatchesTheDefinitionOnOneBlock) {
  // A single partial block: every element times the one scale.
  const at::Tensor codes = at::tensor({0x38, 0xb8, 0x40, 0x01}, at::kByte).view({2, 2});
  const at::Tensor fp8 = codes.view(at::kFloat8_e4m3fn);
  const at::Tensor w = dequantizeFp8Blocks(fp8, at::full({1, 1}, 0.5f), at::kFloat);
  EXPECT_EQ(w[0][0].item<float>(), 0.5f);                         // 0x38 = 1.0
  EXPECT_EQ(w[0][1].item<float>(), -0.5f);                        // 0xb8 = -1.0
  EXPECT_EQ(w[1][0].item<float>(), 1.0f);                         // 0x40 = 2.0
  EXPECT_EQ(w[1][1].item<float>(), 0.5f * fp8E4M3ToFloat(0x01));  // smallest subnormal, 2^-9
}

}  // namespace
}  // namespace tandem::model
