#include "engine/chat/conversation.h"

namespace tandem::chat {

std::string_view roleName(Role role) {
  switch (role) {
    case Role::User: return "user";
    case Role::Assistant: return "assistant";
    case Role::FunctionCall: return "function_call";
    case Role::Observation: return "observation";
  }
  return "?";
}

}  // namespace tandem::chat
