// Generator end to end on a small random Qwen3-MoE with the demo tokenizer: streaming deltas add
// up to the text, eos / stop ids / stop strings / max_new_tokens / cancellation end an answer with
// the right finish reason, adapters switch per request and answer like a model loaded with the
// adapter built in, and bad requests are tandem::Errors.

#include "engine/infer/generator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/memory_ledger.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/failing_cpu_allocator.h"
#include "engine/infer/generate.h"
#include "engine/infer/text_stream.h"
#include "engine/io/tokenizer.h"
#include "engine/model/adapter_files.h"
#include "engine/model/model.h"
#include "engine/model/random_adapter_test_util.h"

namespace tandem::infer {
namespace {

namespace fs = std::filesystem;

struct Fixture {
  fs::path model_dir, adapter_dir;
};

// Once per process: model dir (random weights, demo tokenizer) and a PEFT adapter with non-zero
// LoRA on every attention/MLP linear and on the routed experts.
const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    const fs::path root =
        fs::temp_directory_path() / ("tandem_generator_test_" + std::to_string(::getpid()));
    out.model_dir = root / "model";
    out.adapter_dir = root / "adapter";
    fs::create_directories(out.model_dir);
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(fs::path(TANDEM_RESOURCES_DIR) / "demo" / file, out.model_dir / file,
                    fs::copy_options::overwrite_existing);
    }
    const int64_t vocab = io::Tokenizer::load(out.model_dir).vocabSize();
    const std::string config =
        R"({"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 96,
      "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true,
      "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
      "rope_theta": 10000.0, "tie_word_embeddings": false, "vocab_size": )" +
        std::to_string(vocab) + "}";
    std::ofstream(out.model_dir / "config.json") << config;
    const io::ModelConfig model_config = io::readModelConfig(out.model_dir);
    model::Model::random(model_config, model::ModelOptions{}, nullptr, 11, ThreadPool::global())
        ->writeRandomWeights(out.model_dir / "model.safetensors");

    model::LoraPlan plan;
    plan.settings.rank = 4;
    plan.settings.alpha = 8;
    plan.targets = [](const std::string& name) { return !name.ends_with("mlp.gate"); };
    model::testing::writeRandomAdapter(out.model_dir, out.adapter_dir, plan, /*seed=*/3, 0.5, 0.3f);
    return out;
  }();
  return f;
}

std::unique_ptr<Generator> loadGenerator() {
  GeneratorOptions options;
  options.bf16 = false;
  options.template_name = "qwen3_nothink";
  return Generator::load(fixture().model_dir, options);
}

GenerationSettings greedy(int64_t max_new_tokens) {
  GenerationSettings s;
  s.do_sample = false;
  s.max_new_tokens = max_new_tokens;
  return s;
}

ChatRequest ask(const std::string& question, const GenerationSettings& settings,
                const std::string& adapter = "") {
  return ChatRequest{adapter, {{"user", question}}, settings};
}

TEST(Generator, StreamedDeltasAddUpToTheTextAndIds) {
  auto gen = loadGenerator();
  std::string streamed;
  std::vector<int32_t> streamed_ids;
  const GenerationResult r =
      gen->chat(ask("Who are you?", greedy(24)), [&](const GenerationDelta& d) {
        streamed.append(d.text);
        streamed_ids.insert(streamed_ids.end(), d.token_ids.begin(), d.token_ids.end());
      });
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(streamed_ids, r.token_ids);
  EXPECT_EQ(r.completion_tokens, static_cast<int64_t>(r.token_ids.size()));
  EXPECT_EQ(r.prompt_tokens,
            static_cast<int64_t>(gen->encodeChat({{"user", "Who are you?"}}).size()));
  if (r.finish_reason == FinishReason::Length) {
    EXPECT_EQ(r.completion_tokens, 24);
  }
}

TEST(Generator, StopsOnStopStringsAndNeverShowsThem) {
  auto gen = loadGenerator();
  GenerationSettings s = greedy(40);
  s.stop_on_eos = false;
  const GenerationResult full = gen->chat(ask("hello", s));
  ASSERT_EQ(full.finish_reason, FinishReason::Length);
  ASSERT_GE(full.text.size(), 8u);
  // A stop string from the middle of the answer: the answer ends right before it.
  const size_t at = full.text.size() / 2;
  s.stop = {full.text.substr(at, 3)};
  std::string streamed;
  const GenerationResult cut =
      gen->chat(ask("hello", s), [&](const GenerationDelta& d) { streamed.append(d.text); });
  EXPECT_EQ(cut.finish_reason, FinishReason::Stop);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(s.stop[0])));
  EXPECT_EQ(streamed, cut.text);
  EXPECT_LT(cut.completion_tokens, full.completion_tokens);
}

TEST(Generator, MaxNewTokensAndCancellation) {
  auto gen = loadGenerator();
  GenerationSettings s = greedy(5);
  s.stop_on_eos = false;
  GenerationResult r = gen->chat(ask("hi", s));
  EXPECT_EQ(r.finish_reason, FinishReason::Length);
  EXPECT_EQ(r.completion_tokens, 5);

  s.max_new_tokens = 200;
  std::stop_source cancel;
  int deltas = 0;
  r = gen->chat(
      ask("hi", s),
      [&](const GenerationDelta&) {
        if (++deltas == 3) cancel.request_stop();
      },
      cancel.get_token());
  EXPECT_EQ(r.finish_reason, FinishReason::Cancelled);
  EXPECT_LT(r.completion_tokens, 200);
  EXPECT_EQ(finishReasonName(r.finish_reason), "cancelled");

  std::stop_source already;
  already.request_stop();
  r = gen->chat(ask("hi", s), {}, already.get_token());
  EXPECT_EQ(r.finish_reason, FinishReason::Cancelled);
  EXPECT_EQ(r.completion_tokens, 0);
}

TEST(Generator, StopIdsEndTheAnswerAtTheirFirstOccurrence) {
  auto model =
      model::Model::load(fixture().model_dir, model::ModelOptions{}, nullptr, ThreadPool::global());
  const std::vector<int32_t> prompt = {5, 17, 3, 9};
  GenerationSettings s = greedy(30);
  s.stop_on_eos = false;
  const std::vector<int32_t> free_run = generateTokens(*model, prompt, s, {}, 0).ids;
  ASSERT_EQ(free_run.size(), 30u);
  const int32_t stop_id = free_run[5];
  s.stop_on_eos = true;
  const TokenOutcome r = generateTokens(*model, prompt, s, std::vector<int32_t>{stop_id}, 0);
  const auto first = std::find(free_run.begin(), free_run.end(), stop_id);
  EXPECT_EQ(r.finish_reason, FinishReason::Stop);
  EXPECT_EQ(r.ids, std::vector<int32_t>(free_run.begin(), first + 1));
}

TEST(TextStream, StopTokensAreReportedButNotShownAndCharactersAreNeverSplit) {
  const io::Tokenizer tokenizer = io::Tokenizer::load(fixture().model_dir);
  const int32_t im_end = *tokenizer.tokenToId("<|im_end|>");
  const std::string text = "Hello, caf\xC3\xA9 world";
  std::vector<int32_t> ids = tokenizer.encode(text);
  std::string streamed;
  std::vector<int32_t> streamed_ids;
  TextStream stream(tokenizer, {"wor"}, {im_end}, [&](const GenerationDelta& d) {
    EXPECT_EQ(d.text.find("\xEF\xBF\xBD"), std::string_view::npos);  // no half characters
    streamed.append(d.text);
    streamed_ids.insert(streamed_ids.end(), d.token_ids.begin(), d.token_ids.end());
  });
  bool going = true;
  for (int32_t id : ids) going = going && stream.push(id);
  EXPECT_FALSE(going);  // "wor" completed
  EXPECT_EQ(stream.text(), "Hello, caf\xC3\xA9 ");
  stream.finish();
  EXPECT_EQ(streamed, stream.text());

  TextStream plain(tokenizer, {}, {im_end}, {});
  for (int32_t id : ids) EXPECT_TRUE(plain.push(id));
  EXPECT_TRUE(plain.push(im_end));
  plain.finish();
  EXPECT_EQ(plain.text(), text);
}

TEST(Generator, AdaptersSwitchPerRequestLikeAModelLoadedWithTheAdapter) {
  auto gen = loadGenerator();
  gen->addAdapter("tuned", fixture().adapter_dir);
  EXPECT_EQ(gen->adapterNames(), std::vector<std::string>{"tuned"});
  EXPECT_TRUE(gen->hasAdapter("base"));
  GenerationSettings s = greedy(16);
  s.stop_on_eos = false;
  const std::vector<int32_t> prompt = gen->encodeChat({{"user", "Who are you?"}});
  const auto base1 = gen->generate({"base", prompt, s}).token_ids;
  const auto tuned = gen->generate({"tuned", prompt, s}).token_ids;
  const auto base2 = gen->generate({"", prompt, s}).token_ids;
  EXPECT_EQ(base1, base2);
  EXPECT_NE(base1, tuned);

  // Reference: the adapter built into the model at load (the training path).
  const io::ModelConfig config = io::readModelConfig(fixture().model_dir);
  const model::LoraPlan plan = model::adapterLoraPlan(fixture().adapter_dir, config);
  auto reference =
      model::Model::load(fixture().model_dir, model::ModelOptions{}, &plan, ThreadPool::global());
  model::applyAdapter(fixture().adapter_dir, *reference);
  EXPECT_EQ(generateTokens(*reference, prompt, s, {}, 0).ids, tuned);

  EXPECT_THROW(gen->generate({"nope", prompt, s}), Error);
  EXPECT_THROW(gen->addAdapter("tuned", fixture().adapter_dir), Error);
  EXPECT_THROW(gen->addAdapter("base", fixture().adapter_dir), Error);
  EXPECT_THROW(gen->addAdapter("x", fixture().model_dir), Error);  // no adapter_config.json
}

TEST(Generator, MergedAdapterAnswersLikeTheUnmergedOneAndHidesTheBase) {
  auto unmerged = loadGenerator();
  unmerged->addAdapter("tuned", fixture().adapter_dir);
  auto merged = loadGenerator();
  merged->addAdapter("tuned", fixture().adapter_dir, AdapterMode::Merged);
  GenerationSettings s = greedy(16);
  s.stop_on_eos = false;
  const std::vector<int32_t> prompt = merged->encodeChat({{"user", "Who are you?"}});
  EXPECT_EQ(merged->generate({"tuned", prompt, s}).token_ids,
            unmerged->generate({"tuned", prompt, s}).token_ids);
  EXPECT_FALSE(merged->baseAvailable());
  EXPECT_THROW(merged->generate({"base", prompt, s}), Error);
  EXPECT_THROW(merged->addAdapter("other", fixture().adapter_dir), Error);
}

// Memory running out inside a request (FailingCpuAllocator: as a full GPU fails) is an Error
// that says so, not a crash of the chat or the server, and the next request answers as usual.
TEST(Generator, OutOfMemoryIsAnErrorAndTheNextRequestAnswers) {
  auto gen = loadGenerator();
  GenerationSettings s = greedy(8);
  s.stop_on_eos = false;
  const std::vector<int32_t> prompt = gen->encodeChat({{"user", "Who are you?"}});
  const std::vector<int32_t> want = gen->generate({"", prompt, s}).token_ids;
  gpu::testing::failCpuAllocationIn(40);  // inside the prefill
  try {
    gen->generate({"", prompt, s});
    FAIL() << "the answer went on after an allocation failed";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("out of memory while answering a " + std::to_string(prompt.size()) +
                               "-token prompt: CPU out of memory. Tried to allocate"),
              std::string::npos)
        << e.message();
    EXPECT_EQ(e.message().find("more lines"), std::string::npos) << e.message();
    EXPECT_NE(e.whatToDo().find("max_tokens"), std::string::npos) << e.whatToDo();
  }
  EXPECT_EQ(gen->generate({"", prompt, s}).token_ids, want);
}

TEST(Generator, BadRequestsAreErrors) {
  auto gen = loadGenerator();
  const GenerationSettings s = greedy(4);
  EXPECT_THROW(gen->chat({"", {{"assistant", "hi"}}, s}), Error);
  EXPECT_THROW(gen->chat({"", {{"user", "a"}, {"user", "b"}}, s}), Error);
  EXPECT_THROW(gen->chat({"", {{"wizard", "a"}}, s}), Error);
  EXPECT_THROW(gen->chat({"", {}, s}), Error);
  EXPECT_THROW(gen->generate({"", {}, s}), Error);
  EXPECT_THROW(gen->generate({"", {1, 2, 1 << 30}, s}), Error);
  GenerationSettings bad = s;
  bad.do_sample = true;
  bad.top_p = 0;
  EXPECT_THROW(gen->chat(ask("hi", bad)), Error);
  EXPECT_NO_THROW(gen->chat(
      {"", {{"system", "Be brief."}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}}, s}));
  GeneratorOptions options;
  options.template_name = "no_such_template";
  EXPECT_THROW(Generator::load(fixture().model_dir, options), Error);
  options = GeneratorOptions{};
  options.device = "tpu";
  EXPECT_THROW(Generator::load(fixture().model_dir, options), Error);
  options = GeneratorOptions{};
  options.layer_devices = "cpu:0-9";  // the model has 2 layers
  EXPECT_THROW(Generator::load(fixture().model_dir, options), Error);
  options = GeneratorOptions{};
  options.experts_format = "fp8";  // the fixture's experts are not fp8
  EXPECT_THROW(Generator::load(fixture().model_dir, options), Error);
}

// Host bytes a load adds to the ledger's CPU weights (dense weights and expert packs).
template <typename Load>
uint64_t cpuWeightBytesOf(Load load) {
  const auto weights = [] {
    return MemoryLedger::global().usage("cpu").current(MemoryCategory::Weights);
  };
  const uint64_t before = weights();
  const auto loaded = load();
  return weights() - before;
}

// Inference never runs a backward, so it must not hold the experts' Wᵀ packs: with a packing
// backend a generator holds the forward packs only, a training model with persistent Wᵀ both.
TEST(Generator, HoldsNoBackwardPacksOfTheExperts) {
  if (!cpuFeatures().canUseAvx512Bf16()) GTEST_SKIP() << "needs a packing backend (avx512_bf16)";
  GeneratorOptions options;
  options.device = "cpu";  // on a GPU the planner keeps this small model's experts resident there
  options.bf16 = false;
  options.experts_backend = "generic";  // zero-copy views: no packs
  const uint64_t unpacked =
      cpuWeightBytesOf([&] { return Generator::load(fixture().model_dir, options); });
  options.experts_backend = "avx512_bf16";
  const uint64_t generator =
      cpuWeightBytesOf([&] { return Generator::load(fixture().model_dir, options); });
  model::ModelOptions training;
  training.experts_backend = "avx512_bf16";
  training.experts_wt_policy = experts::WtPolicy::Persistent;
  const uint64_t persistent = cpuWeightBytesOf([&] {
    return model::Model::load(fixture().model_dir, training, nullptr, ThreadPool::global());
  });
  const double forward_packs = static_cast<double>(generator - unpacked);
  ASSERT_GT(forward_packs, 0);
  // The Wᵀ packs are about the size of the forward packs (their column padding differs at these
  // small shapes: 1.8x here); a generator holding them too would make this ratio 1.
  EXPECT_GT(static_cast<double>(persistent - unpacked) / forward_packs, 1.5);
}

}  // namespace
}  // namespace tandem::infer
