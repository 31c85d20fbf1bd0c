// The one-row block kernel (engine/experts/kernels/block_gemv.h) against the few-row kernels it
// replaced at one row (q4kGemmNTVnni, q6kGemmNTAvx512), in one process on the same random Q4_K /
// Q6_K weights and activations: thread CPU time per 256-weight block, the best of `trials`
// interleaved trials of each (CPU time and the best trial: the box may be shared), and the ratio
// (> 1: the one-row kernel is faster). Shapes: a decode step's on the Q4_K_M bench model
// (bench/decode_gguf_bench.py: attention 1024 × 1024, expert gate/up 512 × 1024, down 1024 × 512,
// lm_head 8192 × 1024) and one far past the L3 cache.
//
//   tandem_bench_block_gemv [--trials 7]      one JSON object per line

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/float_convert.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/block_gemv.h"

namespace {

using tandem::experts::WeightType;
namespace ek = tandem::experts::kernels;

double threadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Shape {
  const char* name;
  int64_t rows, cols;
};

}  // namespace

int main(int argc, char** argv) {
  int trials = 7;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--trials") trials = std::max(1, std::atoi(argv[i + 1]));
  }
  if (!ek::hasBlockGemv(WeightType::Q4_K)) {
    std::printf("{\"skipped\": \"no AVX-512 VNNI on this CPU\"}\n");
    return 0;
  }
  std::mt19937 rng(1);
  const Shape shapes[] = {{"attention", 1024, 1024},
                          {"expert_gate_up", 512, 1024},
                          {"expert_down", 1024, 512},
                          {"lm_head", 8192, 1024},
                          {"past_l3", 65536, 1024}};
  for (const WeightType type : {WeightType::Q4_K, WeightType::Q6_K}) {
    const bool q4 = type == WeightType::Q4_K;
    const int64_t block_bytes = q4 ? 144 : 210;
    for (const Shape& shape : shapes) {
      const int64_t blocks = shape.rows * shape.cols / 256;
      std::vector<unsigned char> table(static_cast<size_t>(blocks * block_bytes));
      for (unsigned char& b : table) b = static_cast<unsigned char>(rng());
      const uint16_t d = tandem::floatToFp16(0.01f);
      for (int64_t b = 0; b < blocks; ++b) {  // finite f16 scales: d (and Q4_K's dmin)
        unsigned char* blk = table.data() + b * block_bytes;
        std::memcpy(blk + (q4 ? 0 : 208), &d, 2);
        if (q4) std::memcpy(blk + 2, &d, 2);
      }
      const ek::BlockWeights w{table.data(), type,       {},
                               shape.rows,   shape.cols, shape.cols / 256 * block_bytes};
      std::vector<float> x(static_cast<size_t>(shape.cols)), y(static_cast<size_t>(shape.rows)),
          y_gemv(y.size());
      std::normal_distribution<float> normal;
      for (float& v : x) v = normal(rng);
      auto few_row = [&] {
        if (q4) {
          ek::q4kGemmNTVnni(w, 0, shape.rows, 1, x.data(), shape.cols, y.data(), shape.rows, false);
        } else {
          ek::q6kGemmNTAvx512(w, 0, shape.rows, 1, x.data(), shape.cols, y.data(), shape.rows,
                              false);
        }
      };
      auto one_row = [&] { ek::blockGemv(w, 0, shape.rows, x.data(), y_gemv.data(), false); };
      few_row();
      one_row();
      double num = 0, den = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        num += (y_gemv[i] - y[i]) * (y_gemv[i] - y[i]);
        den += static_cast<double>(y[i]) * y[i];
      }
      const int reps = static_cast<int>(std::max<int64_t>(5, 40000000 / (blocks * block_bytes)));
      double best_few = 1e30, best_one = 1e30;
      for (int t = 0; t < trials; ++t) {
        double start = threadCpuSeconds();
        for (int r = 0; r < reps; ++r) few_row();
        best_few = std::min(best_few, (threadCpuSeconds() - start) / reps);
        start = threadCpuSeconds();
        for (int r = 0; r < reps; ++r) one_row();
        best_one = std::min(best_one, (threadCpuSeconds() - start) / reps);
      }
      std::printf(
          "{\"type\": \"%s\", \"shape\": \"%s\", \"rows\": %ld, \"cols\": %ld, "
          "\"few_row_ns_per_block\": %.2f, \"one_row_ns_per_block\": %.2f, \"ratio\": %.2f, "
          "\"rel_l2_between\": %.1e}\n",
          q4 ? "Q4_K" : "Q6_K", shape.name, static_cast<long>(shape.rows),
          static_cast<long>(shape.cols), 1e9 * best_few / static_cast<double>(blocks),
          1e9 * best_one / static_cast<double>(blocks), best_few / best_one, std::sqrt(num / den));
    }
  }
  return 0;
}
