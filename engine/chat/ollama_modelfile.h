#pragma once
// Ollama Modelfiles (https://github.com/ollama/ollama/blob/main/docs/modelfile.md) for exported
// models: FROM the GGUF, an ADAPTER line for a LoRA GGUF, a TEMPLATE in Ollama's Go-template
// syntax written from the very chat template Tandem trained with, and PARAMETER stop lines for
// its eos and stop words. docs/export.md shows how to use it.

#include <string>

#include "engine/chat/chat_template.h"

namespace tandem::chat {

struct ModelfileSpec {
  std::string from;     // the GGUF model, relative to the Modelfile ("./model.gguf") or absolute
  std::string adapter;  // a llama.cpp LoRA GGUF; empty: no ADAPTER line
  std::string bos_text, eos_text;  // the tokenizer's bos / the template's eos token texts
};

// The TEMPLATE body: the prompt Tandem renders for a generation ({{ .System }} and
// {{ .Prompt }} in place of the system and user text), then {{ .Response }} and what the template
// writes after an answer. Ollama's legacy .System / .Prompt / .Response form.
std::string ollamaTemplate(const ChatTemplate& chat_template, const std::string& bos_text,
                           const std::string& eos_text);

// The whole Modelfile text.
std::string ollamaModelfile(const ModelfileSpec& spec, const ChatTemplate& chat_template);

}  // namespace tandem::chat
