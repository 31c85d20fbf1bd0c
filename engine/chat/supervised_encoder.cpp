#include "engine/chat/supervised_encoder.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "engine/core/error.h"

namespace tandem::chat {

std::vector<int32_t> encodePieces(const Pieces& pieces, const TextEncoder& encoder) {
  std::vector<int32_t> ids;
  for (const Piece& p : pieces) {
    switch (p.kind) {
      case Piece::Kind::Text:
        if (!p.text.empty()) {
          std::vector<int32_t> part = encoder.encode(p.text);
          ids.insert(ids.end(), part.begin(), part.end());
        }
        break;
      case Piece::Kind::Bos:
        if (auto bos = encoder.bosId()) ids.push_back(*bos);
        break;
      case Piece::Kind::Eos: ids.push_back(encoder.eosId()); break;
    }
  }
  return ids;
}

std::pair<int64_t, int64_t> inferSeqlen(int64_t source_len, int64_t target_len,
                                        int64_t cutoff_len) {
  int64_t max_target_len;
  if (target_len * 2 < cutoff_len) {  // truncate source
    max_target_len = cutoff_len;
  } else if (source_len * 2 < cutoff_len) {  // truncate target
    max_target_len = cutoff_len - source_len;
  } else {  // truncate both, in proportion: int(cutoff_len * (target_len / (source_len +
            // target_len)))
    const double share =
        static_cast<double>(target_len) / static_cast<double>(source_len + target_len);
    max_target_len = static_cast<int64_t>(static_cast<double>(cutoff_len) * share);
  }
  const int64_t new_target_len = std::min(max_target_len, target_len);
  const int64_t max_source_len = std::max<int64_t>(cutoff_len - new_target_len, 0);
  const int64_t new_source_len = std::min(max_source_len, source_len);
  return {new_source_len, new_target_len};
}

EncodedSample encodeSupervised(const Conversation& conv, const ChatTemplate& chat_template,
                               const TextEncoder& encoder, const SupervisedOptions& options) {
  if (options.cutoff_len < 1)
    throw Error("cutoff_len must be at least 1 (got " + std::to_string(options.cutoff_len) + ")",
                "");
  const bool efficient_eos = chat_template.efficientEos();
  if (options.train_on_prompt && efficient_eos)
    throw Error("template '" + chat_template.name() + "' does not support train_on_prompt",
                "turn train_on_prompt off (LLaMA-Factory refuses this combination too)");

  std::vector<TurnPieces> turns = chat_template.encodeTurns(conv);
  if (options.mask_history)
    std::reverse(turns.begin(), turns.end());  // high priority for last turns

  EncodedSample out;
  int64_t total_length = efficient_eos ? 1 : 0;
  for (size_t turn_idx = 0; turn_idx < turns.size(); ++turn_idx) {
    if (total_length >= options.cutoff_len) break;
    std::vector<int32_t> source = encodePieces(turns[turn_idx].prompt, encoder);
    std::vector<int32_t> target = encodePieces(turns[turn_idx].response, encoder);
    auto [source_len, target_len] =
        inferSeqlen(static_cast<int64_t>(source.size()), static_cast<int64_t>(target.size()),
                    options.cutoff_len - total_length);
    source.resize(static_cast<size_t>(source_len));
    target.resize(static_cast<size_t>(target_len));
    total_length += source_len + target_len;

    std::vector<int32_t> source_label;
    if (options.train_on_prompt) {
      source_label = source;
    } else {
      source_label.assign(source.size(), kIgnoreIndex);
      // efficient_eos: the eos that ends the previous reply sits at the start of this prompt
      // (supervised.py puts it there for every turn but the first in processing order).
      if (efficient_eos && turn_idx != 0 && !source_label.empty())
        source_label[0] = encoder.eosId();
    }
    std::vector<int32_t> target_label = target;
    if (options.mask_history && turn_idx != 0) target_label.assign(target.size(), kIgnoreIndex);

    auto prepend_or_append = [&](std::vector<int32_t>& into, const std::vector<int32_t>& a,
                                 const std::vector<int32_t>& b) {
      std::vector<int32_t> turn = a;
      turn.insert(turn.end(), b.begin(), b.end());
      // mask_history processes turns last-first, so each earlier turn goes in front.
      into.insert(options.mask_history ? into.begin() : into.end(), turn.begin(), turn.end());
    };
    prepend_or_append(out.input_ids, source, target);
    prepend_or_append(out.labels, source_label, target_label);
  }
  if (efficient_eos) {
    out.input_ids.push_back(encoder.eosId());
    out.labels.push_back(encoder.eosId());
  }
  return out;
}

std::vector<std::vector<int64_t>> greedyKnapsack(std::vector<int64_t> lengths, int64_t capacity) {
  // A multiset replaces Python's sorted list + bisect + pop(index): same choices, O(n log n).
  std::multiset<int64_t> numbers(lengths.begin(), lengths.end());
  std::vector<std::vector<int64_t>> knapsacks;
  while (!numbers.empty()) {
    std::vector<int64_t> current;
    int64_t remaining = capacity;
    for (;;) {
      auto it = numbers.upper_bound(remaining);  // bisect.bisect: first element > remaining
      if (it == numbers.begin()) break;          // nothing fits
      --it;
      remaining -= *it;
      current.push_back(*it);
      numbers.erase(it);
    }
    // A length larger than the capacity never fits; LLaMA-Factory filters those out first, and
    // so does packSamples. Guard against an endless loop for direct callers.
    if (current.empty()) {
      current.push_back(*numbers.begin());
      numbers.erase(numbers.begin());
    }
    knapsacks.push_back(std::move(current));
  }
  return knapsacks;
}

PackResult packSamples(const std::vector<EncodedSample>& samples, int64_t cutoff_len) {
  PackResult result;
  std::vector<int64_t> lengths;
  std::map<int64_t, std::vector<size_t>> length_to_indices;
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto length = static_cast<int64_t>(samples[i].input_ids.size());
    if (length > cutoff_len) {
      result.dropped.push_back(i);
      continue;
    }
    lengths.push_back(length);
    length_to_indices[length].push_back(i);
  }
  for (const std::vector<int64_t>& knapsack : greedyKnapsack(std::move(lengths), cutoff_len)) {
    PackedSequence row;
    int32_t segment = 0;
    for (int64_t length : knapsack) {
      std::vector<size_t>& candidates = length_to_indices[length];
      const size_t index = candidates.back();  // length2indexes[length].pop()
      candidates.pop_back();
      const EncodedSample& s = samples[index];
      ++segment;
      row.input_ids.insert(row.input_ids.end(), s.input_ids.begin(), s.input_ids.end());
      row.labels.insert(row.labels.end(), s.labels.begin(), s.labels.end());
      for (int32_t p = 0; p < static_cast<int32_t>(length); ++p) {
        row.position_ids.push_back(p);
        row.segment_ids.push_back(segment);
      }
      row.samples.push_back(index);
    }
    result.sequences.push_back(std::move(row));
  }
  return result;
}

}  // namespace tandem::chat
