#pragma once
// tandem::Error: the one exception type the engine throws for anything a user can act on.
// It carries two texts: what is wrong, and what to do about it. The CLI prints both and exits
// non-zero; the studio shows them in place. Invariant violations are not Errors (they assert).

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message, std::string what_to_do = {});

  const std::string& message() const { return message_; }
  const std::string& whatToDo() const { return what_to_do_; }

 private:
  std::string message_;
  std::string what_to_do_;
};

// Thrown when a long engine call stops because its std::stop_token was triggered.
class Cancelled : public Error {
 public:
  Cancelled() : Error("cancelled") {}
};

// Thrown when a device or the host ran out of memory inside an engine call (engine/model turns
// libtorch's out-of-memory error into this); message() is the allocator's first line. Callers
// add what was running and what to change.
class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(std::string message) : Error(std::move(message)) {}
};

}  // namespace tandem
