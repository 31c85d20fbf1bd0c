#include "engine/chat/ollama_modelfile.h"

#include <gtest/gtest.h>

namespace tandem::chat {
namespace {

TEST(OllamaModelfile, Qwen3NoThinkTemplateIsTandemsPrompt) {
  const std::string t = ollamaTemplate(templateByName("qwen3_nothink"), "", "<|im_end|>");
  // The system prompt's branch is the whole prompt with it (the template may place it anywhere).
  EXPECT_EQ(t,
            "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n"
            "<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n"
            "{{ else }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n"
            "{{ end }}{{ .Response }}<|im_end|>\n");
}

TEST(OllamaModelfile, Llama3KeepsBosAndEotStops) {
  const ChatTemplate& llama3 = templateByName("llama3");
  const std::string text =
      ollamaModelfile({"./m.gguf", "./lora.gguf", "<|begin_of_text|>", "<|eot_id|>"}, llama3);
  EXPECT_NE(text.find("FROM ./m.gguf\nADAPTER ./lora.gguf\nTEMPLATE \"\"\""), std::string::npos)
      << text;
  EXPECT_NE(text.find("<|begin_of_text|>"), std::string::npos) << text;
  EXPECT_NE(text.find("<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}<|eot_id|>"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("PARAMETER stop \"<|eot_id|>\"\n"), std::string::npos) << text;
  // Each stop once, even when the eos is also a stop word.
  EXPECT_EQ(text.find("PARAMETER stop \"<|eot_id|>\""),
            text.rfind("PARAMETER stop \"<|eot_id|>\""));
}

}  // namespace
}  // namespace tandem::chat
