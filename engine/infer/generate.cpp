#include "engine/infer/generate.h"

#include <algorithm>
#include <chrono>
#include <string>

#ifndef _WIN32
#include <time.h>
#endif

#include "engine/core/error.h"
#include "engine/infer/sampler.h"
#include "engine/model/decode_session.h"
#include "engine/model/model.h"

namespace tandem::infer {

namespace {

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// CPU seconds the process has used so far (every thread), or -1 where not measured.
double processCpuSeconds() {
#ifndef _WIN32
  timespec t{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) == 0) {
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
#endif
  return -1;
}

}  // namespace

TokenOutcome generateTokens(const model::Model& model, std::span<const int32_t> prompt,
                            const GenerationSettings& settings, std::span<const int32_t> stop_ids,
                            uint64_t seed, const TokenCallback& on_token, std::stop_token stop) {
  if (prompt.empty()) throw Error("cannot generate from an empty prompt");
  validateSettings(settings);
  const int64_t context = model.config().max_position_embeddings;
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (context > 0 && prompt_len >= context) {
    throw Error("the prompt has " + std::to_string(prompt_len) +
                    " tokens; the model's context is " + std::to_string(context),
                "shorten the conversation (/reset in chat)");
  }
  // The answer stops at the model's context, like transformers' max_length.
  int64_t capacity = prompt_len + settings.max_new_tokens;
  if (context > 0) capacity = std::min(capacity, context);
  const int64_t max_new = capacity - prompt_len;

  model::DecodeSession session(model, capacity);
  Sampler sampler(settings, seed);
  std::vector<int32_t> seen(prompt.begin(), prompt.end());
  seen.reserve(seen.size() + static_cast<size_t>(max_new));
  TokenOutcome out;
  if (stop.stop_requested()) {
    out.finish_reason = FinishReason::Cancelled;
    return out;
  }

  auto start = std::chrono::steady_clock::now();
  std::vector<float> logits = session.feed(prompt);
  out.prefill_seconds = secondsSince(start);
  start = std::chrono::steady_clock::now();
  const double cpu_start = processCpuSeconds();
  while (true) {
    const int32_t id = sampler.next(std::move(logits), seen);
    out.ids.push_back(id);
    seen.push_back(id);
    const bool is_stop =
        settings.stop_on_eos && std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
    const bool keep_going = on_token ? on_token(id) : true;
    if (is_stop || !keep_going) {
      out.finish_reason = FinishReason::Stop;
      break;
    }
    if (static_cast<int64_t>(out.ids.size()) >= max_new) {
      out.finish_reason = FinishReason::Length;
      break;
    }
    if (stop.stop_requested()) {
      out.finish_reason = FinishReason::Cancelled;
      break;
    }
    logits = session.feed(std::span<const int32_t>(&id, 1));
  }
  out.decode_seconds = secondsSince(start);
  const double cpu_end = processCpuSeconds();
  if (cpu_start >= 0 && cpu_end >= 0) out.decode_cpu_seconds = cpu_end - cpu_start;
  return out;
}

}  // namespace tandem::infer
