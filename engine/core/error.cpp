#include "engine/core/error.h"

namespace tandem {

namespace {
std::string fullText(const std::string& message, const std::string& what_to_do) {
  return what_to_do.empty() ? message : message + "\n  what to do: " + what_to_do;
}
}  // namespace

Error::Error(std::string message, std::string what_to_do)
    : std::runtime_error(fullText(message, what_to_do)),
      message_(std::move(message)),
      what_to_do_(std::move(what_to_do)) {}

}  // namespace tandem
