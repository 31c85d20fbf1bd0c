#include "engine/chat/ollama_modelfile.h"

#include <set>

namespace tandem::chat {
namespace {

// Stand-ins for the user's text that no template contains; replaced by Go-template actions.
constexpr const char* kSystemMark = "\x01TANDEM_SYSTEM\x01";
constexpr const char* kPromptMark = "\x01TANDEM_PROMPT\x01";
constexpr const char* kResponseMark = "\x01TANDEM_RESPONSE\x01";

void replaceAll(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

std::string promptFor(const ChatTemplate& chat_template, const std::string& system,
                      const std::string& bos_text, const std::string& eos_text) {
  Conversation conv;
  conv.system = system;
  conv.messages.push_back({Role::User, kPromptMark});
  std::string text = joinPieces(chat_template.renderForGeneration(conv), bos_text, eos_text);
  replaceAll(text, kSystemMark, "{{ .System }}");
  replaceAll(text, kPromptMark, "{{ .Prompt }}");
  return text;
}

// Ollama's Modelfile strings are """-quoted; a quote run inside would end them.
std::string quoted(const std::string& text) {
  std::string escaped = text;
  replaceAll(escaped, "\"\"\"", "\\\"\\\"\\\"");
  return "\"\"\"" + escaped + "\"\"\"";
}

}  // namespace

std::string ollamaTemplate(const ChatTemplate& chat_template, const std::string& bos_text,
                           const std::string& eos_text) {
  const std::string with_system = promptFor(chat_template, kSystemMark, bos_text, eos_text);
  const std::string without_system = promptFor(chat_template, "", bos_text, eos_text);
  // What the template writes after an answer (e.g. "<|im_end|>\n"): the response of one
  // encoded pair past the answer's text.
  Conversation conv;
  conv.messages.push_back({Role::User, kPromptMark});
  conv.messages.push_back({Role::Assistant, kResponseMark});
  const std::string response = chat_template.encodePairs(conv, bos_text, eos_text).back().second;
  const size_t mark = response.find(kResponseMark);
  const std::string suffix = mark == std::string::npos
                                 ? std::string()
                                 : response.substr(mark + std::string(kResponseMark).size());
  std::string body;
  if (with_system == without_system) {
    body = without_system;
  } else {
    body = "{{ if .System }}" + with_system + "{{ else }}" + without_system + "{{ end }}";
  }
  return body + "{{ .Response }}" + suffix;
}

std::string ollamaModelfile(const ModelfileSpec& spec, const ChatTemplate& chat_template) {
  std::string text =
      "# Made by `tandem export` (docs/export.md). Use: ollama create NAME -f Modelfile\n";
  text += "FROM " + spec.from + "\n";
  if (!spec.adapter.empty()) text += "ADAPTER " + spec.adapter + "\n";
  text += "TEMPLATE " + quoted(ollamaTemplate(chat_template, spec.bos_text, spec.eos_text)) + "\n";
  std::set<std::string> seen;
  std::vector<std::string> stops;
  if (!spec.eos_text.empty()) stops.push_back(spec.eos_text);
  for (const std::string& word : chat_template.stopWords()) stops.push_back(word);
  for (const std::string& stop : stops) {
    if (seen.insert(stop).second) text += "PARAMETER stop \"" + stop + "\"\n";
  }
  return text;
}

}  // namespace tandem::chat
