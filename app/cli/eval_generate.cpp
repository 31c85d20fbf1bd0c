#include "app/cli/eval_generate.h"

#include <cstdio>

#include "engine/core/error.h"
#include "engine/infer/generator.h"
#include "engine/io/tokenizer.h"
#include "engine/model/model_report.h"
#include "engine/train/dataset.h"

namespace tandem::cli {

namespace {

std::string generatorRole(chat::Role role) {
  switch (role) {
    case chat::Role::User: return "user";
    case chat::Role::Observation: return "observation";
    case chat::Role::Assistant:
    case chat::Role::FunctionCall: return "assistant";
  }
  return "user";
}

infer::GenerationSettings generationSettings(const GenerateEvalOptions& options) {
  infer::GenerationSettings settings;
  settings.do_sample = options.settings.do_sample;
  settings.temperature = options.settings.temperature;
  settings.top_p = options.settings.top_p;
  settings.top_k = options.settings.top_k;
  settings.repetition_penalty = options.settings.repetition_penalty;
  settings.max_new_tokens = options.settings.max_new_tokens;
  settings.seed = options.seed;
  return settings;
}

}  // namespace

PreparedEval prepareGenerateEval(const GenerateEvalOptions& options) {
  train::DatasetReport report;
  auto data = std::make_shared<const std::vector<chat::Conversation>>(train::loadDatasets(
      options.dataset_dir, train::splitDatasetNames(options.dataset), options.max_samples, report));
  std::shared_ptr<infer::Generator> generator =
      infer::Generator::load(options.model, options.generator);
  std::fprintf(stderr, "[eval] %s\n", model::placementSummary(generator->placement()).c_str());
  std::string adapter;
  if (!options.adapter.empty()) {
    adapter = "adapter";
    generator->addAdapter(adapter, options.adapter);
  }
  PreparedEval prepared;
  prepared.samples = static_cast<int64_t>(data->size());
  prepared.bad_rows = report.totalSkipped();
  for (const train::DatasetFileReport& file : report.datasets) {
    for (const train::RowProblem& problem : file.first_problems) {
      if (prepared.first_problems.size() < eval::PredictionsFile::kMaxReportedProblems) {
        prepared.first_problems.push_back({problem.line, file.file + ": " + problem.reason});
      }
    }
  }
  const infer::GenerationSettings settings = generationSettings(options);
  // LLaMA-Factory's predict: the prompt is every message before the last response (decoded with
  // its special tokens), the label is that response.
  prepared.predict = [generator, data, settings, adapter](int64_t index, std::stop_token stop) {
    const chat::Conversation& conversation = (*data)[static_cast<size_t>(index)];
    infer::ChatRequest request;
    request.adapter = adapter;
    request.settings = settings;
    if (!conversation.system.empty()) request.messages.push_back({"system", conversation.system});
    for (size_t i = 0; i + 1 < conversation.messages.size(); ++i) {
      request.messages.push_back(
          {generatorRole(conversation.messages[i].role), conversation.messages[i].content});
    }
    const std::vector<int32_t> prompt_ids = generator->encodeChat(request.messages);
    const infer::GenerationResult result = generator->chat(request, {}, stop);
    if (result.finish_reason == infer::FinishReason::Cancelled) throw Cancelled();
    return eval::PredictionRow{
        generator->tokenizer().decode(prompt_ids, /*skip_special_tokens=*/false), result.text,
        conversation.messages.back().content};
  };
  return prepared;
}

}  // namespace tandem::cli
