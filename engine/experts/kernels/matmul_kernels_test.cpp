// Every vector table's matmul kernels (avx512::, avx2::) against ref:: over ragged shapes, every
// weight dtype, alpha and accumulate, with weight pointers aligned to only 2 bytes.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/core/float_convert.h"
#include "engine/experts/kernels/vector_kernels_test_util.h"

namespace tandem::experts::kernels {
namespace {

std::vector<float> randomFloats(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// values as `type` bits, starting 2 bytes past a 4-byte boundary.
std::vector<unsigned char> encode(const std::vector<float>& values, WeightType type) {
  const int64_t elem = weightTypeBytes(type);
  std::vector<unsigned char> bytes(2 + values.size() * elem + 2);
  for (size_t i = 0; i < values.size(); ++i) {
    if (type == WeightType::F32) {
      std::memcpy(bytes.data() + 2 + i * 4, &values[i], 4);
    } else {
      const uint16_t bits =
          type == WeightType::BF16 ? floatToBf16(values[i]) : floatToFp16(values[i]);
      std::memcpy(bytes.data() + 2 + i * 2, &bits, 2);
    }
  }
  return bytes;
}

::testing::AssertionResult near(const std::vector<float>& got, const std::vector<float>& want,
                                int64_t k, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    // fp32 sums of k products of magnitude ≤ 1 in a different order.
    const double tol = 1e-5 * (1.0 + std::sqrt(static_cast<double>(k))) * (1.0 + std::abs(want[i]));
    if (!(std::abs(got[i] - want[i]) <= tol)) {
      return ::testing::AssertionFailure()
             << what << ": first bad index " << i << " got " << got[i] << " want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

class VectorMatmul : public testing::VectorKernelsTest {
 protected:
  std::mt19937 rng_{7};
};

// m: below, at and past every tile height (NT: avx512 4 rows, avx2 2; NN / TN: avx512 4, avx2 3);
// n: below, at and past the tile widths (avx2 NT: 6, then 2-wide tiles for the rest; NN: 16 and
// 32 columns) and a vector of 8; k: below, at and past a vector of 8 and 16.
const int64_t kMs[] = {1, 3, 5, 6, 7, 13, 17};
const int64_t kNs[] = {1, 6, 7, 8, 16, 33, 70};
const int64_t kKs[] = {1, 5, 8, 16, 19, 45};

TEST_P(VectorMatmul, NTAndNNMatchRef) {
  for (const WeightType type : {WeightType::F32, WeightType::BF16, WeightType::F16}) {
    for (int64_t m : kMs) {
      for (int64_t n : kNs) {
        for (int64_t k : kKs) {
          const int64_t lda = k + 3, ldc = n + 2;
          const std::vector<float> a = randomFloats(rng_, m * lda);
          const std::vector<float> c0 = randomFloats(rng_, m * ldc);
          const std::vector<unsigned char> b_nt = encode(randomFloats(rng_, n * (k + 1)), type);
          const std::vector<unsigned char> b_nn = encode(randomFloats(rng_, k * (n + 1)), type);
          for (const bool accumulate : {false, true}) {
            const std::string what = std::string(weightTypeName(type)) + " m=" + std::to_string(m) +
                                     " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                     (accumulate ? " +=" : " =");
            std::vector<float> want = c0, got = c0;
            ref::matmulNT(m, n, k, 0.5f, a.data(), lda, b_nt.data() + 2, type, k + 1, want.data(),
                          ldc, accumulate);
            kernels().matmulNT(m, n, k, 0.5f, a.data(), lda, b_nt.data() + 2, type, k + 1,
                               got.data(), ldc, accumulate);
            EXPECT_TRUE(near(got, want, k, "NT " + what));
            want = c0;
            got = c0;
            ref::matmulNN(m, n, k, 1.5f, a.data(), lda, b_nn.data() + 2, type, n + 1, want.data(),
                          ldc, accumulate);
            kernels().matmulNN(m, n, k, 1.5f, a.data(), lda, b_nn.data() + 2, type, n + 1,
                               got.data(), ldc, accumulate);
            EXPECT_TRUE(near(got, want, k, "NN " + what));
          }
        }
      }
    }
  }
}

// avx2's matmulNN sums over k in panels of 128 from 12 rows on (17 here; 6 and 7 read b in
// place): k at, past and well past one panel, the last one ragged.
TEST_P(VectorMatmul, NNOverSeveralPanelsMatchesRef) {
  for (const WeightType type : {WeightType::F32, WeightType::BF16, WeightType::F16}) {
    for (int64_t m : {6, 7, 17}) {
      for (int64_t n : {33, 70}) {
        for (int64_t k : {128, 129, 300}) {
          const int64_t lda = k + 3, ldc = n + 2;
          const std::vector<float> a = randomFloats(rng_, m * lda);
          const std::vector<float> c0 = randomFloats(rng_, m * ldc);
          const std::vector<unsigned char> b = encode(randomFloats(rng_, k * (n + 1)), type);
          for (const bool accumulate : {false, true}) {
            std::vector<float> want = c0, got = c0;
            ref::matmulNN(m, n, k, 1.5f, a.data(), lda, b.data() + 2, type, n + 1, want.data(), ldc,
                          accumulate);
            kernels().matmulNN(m, n, k, 1.5f, a.data(), lda, b.data() + 2, type, n + 1, got.data(),
                               ldc, accumulate);
            EXPECT_TRUE(near(got, want, k,
                             "NN " + std::string(weightTypeName(type)) + " m=" + std::to_string(m) +
                                 " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                 (accumulate ? " +=" : " =")));
          }
        }
      }
    }
  }
}

TEST_P(VectorMatmul, TNMatchesRef) {
  for (int64_t m : kMs) {
    for (int64_t n : kNs) {
      for (int64_t k : kKs) {
        const std::vector<float> a = randomFloats(rng_, m * (k + 1));
        const std::vector<float> b = randomFloats(rng_, m * (n + 2));
        const std::vector<float> c0 = randomFloats(rng_, k * (n + 3));
        std::vector<float> want = c0, got = c0;
        ref::matmulTN(m, n, k, 0.75f, a.data(), k + 1, b.data(), n + 2, want.data(), n + 3);
        kernels().matmulTN(m, n, k, 0.75f, a.data(), k + 1, b.data(), n + 2, got.data(), n + 3);
        EXPECT_TRUE(near(
            got, want, m,
            "TN m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k)));
      }
    }
  }
}

// The generic table is the specification itself, so holding the vector tables to ref:: holds
// them to what generic runs; every table fills every entry and carries the name dispatch uses.
TEST(KernelTables, GenericIsRefAndEveryTableIsComplete) {
  const ExpertKernels& generic = genericKernels();
  EXPECT_STREQ(generic.name, "generic");
  EXPECT_EQ(generic.matmulNT, &ref::matmulNT);
  EXPECT_EQ(generic.matmulNN, &ref::matmulNN);
  EXPECT_EQ(generic.matmulTN, &ref::matmulTN);
  EXPECT_EQ(generic.siluMul, &ref::siluMul);
  EXPECT_EQ(generic.siluBackward, &ref::siluBackward);
  EXPECT_EQ(generic.axpy, &ref::axpy);
  EXPECT_EQ(generic.widenBf16, &ref::widenBf16);
  for (const std::string& name : testing::vectorTableNames()) {
    const ExpertKernels& table = *testing::vectorTable(name).kernels;
    EXPECT_EQ(table.name, name);
    EXPECT_TRUE(table.matmulNT && table.matmulNN && table.matmulTN && table.siluMul &&
                table.siluBackward && table.axpy && table.widenBf16)
        << name << " leaves an entry empty";
  }
}

// Empty on a build without x86 kernels.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(VectorMatmul);
INSTANTIATE_TEST_SUITE_P(Tables, VectorMatmul, ::testing::ValuesIn(testing::vectorTableNames()),
                         testing::vectorTableName);

}  // namespace
}  // namespace tandem::experts::kernels
