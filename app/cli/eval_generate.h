#pragma once
// The generating half of `tandem eval`: loads the dataset and the model (with its adapter) and
// returns the function that answers sample i, through the generation API
// (engine/infer/generator.h).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/eval/batch_eval.h"
#include "engine/infer/generator.h"

namespace tandem::cli {

struct GenerateEvalOptions {
  std::string model;
  std::string adapter;
  std::string dataset;               // comma-separated names, or a file
  std::string dataset_dir = "data";  // LLaMA-Factory's default
  std::optional<int64_t> max_samples;
  // How the model is placed (the planner's placement by default, as for chat and serve) and its
  // template (empty: the generator's choice for the model type).
  infer::GeneratorOptions generator;
  // Decoding: LLaMA-Factory's generating defaults, except greedy (do_sample false) unless asked.
  struct {
    bool do_sample = false;
    double temperature = 0.95;
    double top_p = 0.7;
    int64_t top_k = 50;
    double repetition_penalty = 1.0;
    int64_t max_new_tokens = 1024;
  } settings;
  std::optional<uint64_t> seed;
};

struct PreparedEval {
  int64_t samples = 0;
  int64_t bad_rows = 0;  // dataset rows that could not be used
  std::vector<eval::BadRow> first_problems;
  eval::PredictFn predict;  // owns the model and the data
};

// Throws tandem::Error on a bad model, adapter, dataset or template.
PreparedEval prepareGenerateEval(const GenerateEvalOptions& options);

}  // namespace tandem::cli
