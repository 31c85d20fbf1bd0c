#pragma once
// Chat templates by name, written exactly as LLaMA-Factory registers them in
// src/llamafactory/data/template.py (see docs/data_and_templates.md for the version and the
// strings). A template turns a Conversation into TEXT pieces; it does not tokenize. The pieces
// keep LLaMA-Factory's element boundaries, because LLaMA-Factory tokenizes every slot string on
// its own (`tokenizer.encode(elem)` per element) and BPE over a concatenation can differ.
//
// Supported: qwen3, qwen3_nothink, qwen, deepseek3, deepseek, llama3, mistral, default, empty.
// Tool definitions and function-call turns need LLaMA-Factory's tool formatters and are refused
// with a tandem::Error; observation turns are supported.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/chat/conversation.h"

namespace tandem::chat {

// One element of a rendered message, as in LLaMA-Factory's SLOTS: text the tokenizer encodes on
// its own, or the tokenizer's bos / eos token (set{"bos_token"} / set{"eos_token"}).
struct Piece {
  enum class Kind : uint8_t { Text, Bos, Eos };
  Kind kind = Kind::Text;
  std::string text;  // Kind::Text only
  bool operator==(const Piece&) const = default;
};
using Pieces = std::vector<Piece>;

// The pieces as one string, bos / eos written as the given token texts (e.g. "<s>", "</s>").
std::string joinPieces(const Pieces& pieces, std::string_view bos_text = {},
                       std::string_view eos_text = {});

// One (prompt, response) pair of Template.encode_multiturn: the prompt holds the prefix and
// system prompt on the first turn; the response is what the loss is computed on.
struct TurnPieces {
  Pieces prompt;
  Pieces response;
};

class ChatTemplate {
 public:
  enum class Kind : uint8_t {
    Standard,   // Template
    Llama2,     // Llama2Template: the system text is fused into the first user message
    Reasoning,  // ReasoningTemplate: empty <think></think> handling, see encodeTurns
  };

  // The fields of LLaMA-Factory's register_template. Text slots may hold {{content}} and {{idx}}.
  struct Spec {
    std::string name;
    Pieces format_user, format_assistant, format_system, format_observation, format_prefix;
    std::string default_system;
    std::vector<std::string> stop_words;
    std::pair<std::string, std::string> thought_words{"<think>\n", "\n</think>\n\n"};
    bool efficient_eos = false;
    bool replace_eos = false;
    Kind kind = Kind::Standard;
  };

  explicit ChatTemplate(Spec spec) : spec_(std::move(spec)) {}

  const std::string& name() const { return spec_.name; }
  Kind kind() const { return spec_.kind; }
  const std::vector<std::string>& stopWords() const { return spec_.stop_words; }
  // efficient_eos: the eos is appended once at the end of the sample instead of after every reply.
  bool efficientEos() const { return spec_.efficient_eos; }
  // replace_eos: training must use stopWords()[0] as the eos token (LLaMA-Factory swaps the
  // tokenizer's eos); see effectiveEosToken.
  bool replaceEos() const { return spec_.replace_eos; }
  std::string effectiveEosToken(std::string_view tokenizer_eos_token) const;
  const std::string& defaultSystem() const { return spec_.default_system; }
  const Spec& spec() const { return spec_; }

  // LLaMA-Factory's `default_system` override.
  void setDefaultSystem(std::string system) { spec_.default_system = std::move(system); }
  // LLaMA-Factory's `enable_thinking` (default true; nullopt is Python's None, which behaves like
  // false for the empty think block but does not strip thoughts). Only Reasoning templates use it.
  void setEnableThinking(std::optional<bool> enable) { enable_thinking_ = enable; }
  std::optional<bool> enableThinking() const { return enable_thinking_; }

  // Template.encode_multiturn: one TurnPieces per (prompt, response) message pair. `conv` must
  // hold an even number of alternating messages (as loadDatasets produces).
  std::vector<TurnPieces> encodeTurns(const Conversation& conv) const;

  // encodeTurns joined to strings: the exact texts LLaMA-Factory tokenizes, bos/eos written as
  // the given token texts.
  std::vector<std::pair<std::string, std::string>> encodePairs(
      const Conversation& conv, std::string_view bos_text = {},
      std::string_view eos_text = {}) const;

  // Template.encode_oneturn: everything before the last response, and the last response.
  TurnPieces encodeOneTurn(const Conversation& conv) const;

  // The prompt for generating the next assistant reply: `conv` ends with a user (or observation)
  // message, i.e. it has an odd number of messages. This is LLaMA-Factory's chat path:
  // encode_oneturn(messages + [{"role": "assistant", "content": ""}]).prompt.
  Pieces renderForGeneration(const Conversation& conv) const;

  // ReasoningTemplate.add_thought() ("<think>\n\n</think>\n\n") and remove_thought().
  std::string emptyThought() const {
    return spec_.thought_words.first + spec_.thought_words.second;
  }
  std::string removeThought(std::string_view content) const;

 private:
  std::vector<Pieces> encodeMessages(const Conversation& conv) const;  // Template._encode
  bool hasThought(std::string_view content) const;

  Spec spec_;
  std::optional<bool> enable_thinking_ = true;
};

// Throws tandem::Error listing templateNames() for an unknown name.
const ChatTemplate& templateByName(std::string_view name);
std::vector<std::string> templateNames();

}  // namespace tandem::chat
