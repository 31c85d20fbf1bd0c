#pragma once
// Multiple-choice answers (MMLU / C-Eval / CMMLU style: the label is one letter, "A".."D").
//
// LLaMA-Factory's own evaluator (src/llamafactory/eval/evaluator.py) never reads generated text:
// it compares the next-token logits of the choice letters after the prompt. `tandem eval
// --choices` does the same when it generates (engine/eval/batch_eval.h); this file is the
// text side, for scoring a predictions file and for labels:
//
//   1. the text, stripped of white space, is exactly one choice letter; or
//   2. it starts with a choice letter followed by a character that is not an ASCII letter or
//      digit ("B. Paris", "C)", "D：因为"); or
//   3. the last choice letter that stands alone, i.e. not next to an ASCII letter or digit
//      ("The answer is C.", "答案是B", "(A)").
// Letters are matched case-sensitively (so the article "a" is never an answer).

#include <optional>
#include <string_view>

namespace tandem::eval {

// The choice `text` names among `letters` (e.g. "ABCD"), or nullopt.
std::optional<char> extractChoice(std::string_view text, std::string_view letters);

}  // namespace tandem::eval
