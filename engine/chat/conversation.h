#pragma once
// A conversation as templates and encoders see it: an optional system prompt and tools, then
// messages that alternate prompt (user / observation) and answer (assistant / function call).
// Datasets (engine/train/dataset.h) produce them for training; chat requests for generation.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::chat {

enum class Role : uint8_t { User, Assistant, FunctionCall, Observation };
std::string_view roleName(Role role);  // "user", "assistant", "function_call", "observation"

struct Message {
  Role role = Role::User;
  std::string content;
};

// Where a conversation came from, for error messages.
struct SourceRef {
  std::string file;   // path as given / resolved
  int64_t line = 0;   // 1-based line where the record starts (csv: the record's first line)
  int64_t index = 0;  // 0-based record index in the file (csv: not counting the header)
};

// messages alternate: even positions User or Observation, odd positions Assistant or FunctionCall;
// the count is even (>= 2), so the last message is the response that is trained on.
struct Conversation {
  std::string system;  // empty: the template's default system prompt applies
  std::string tools;   // JSON text of the tool list, empty when none
  std::vector<Message> messages;
  SourceRef source;
};

}  // namespace tandem::chat
