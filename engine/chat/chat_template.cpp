#include "engine/chat/chat_template.h"

#include <algorithm>
#include <map>

#include "engine/core/error.h"

namespace tandem::chat {
namespace {

Piece text(std::string s) { return {Piece::Kind::Text, std::move(s)}; }
const Piece kBos{Piece::Kind::Bos, {}};
const Piece kEos{Piece::Kind::Eos, {}};

// StringFormatter.apply: in every text slot, the first "{{content}}" (then the first "{{idx}}")
// is replaced, exactly like Python's str.replace(placeholder, value, 1) in formatter.py.
void replaceFirst(std::string& slot, std::string_view placeholder, std::string_view value) {
  size_t pos = slot.find(placeholder);
  if (pos != std::string::npos) slot.replace(pos, placeholder.size(), value);
}

Pieces applySlots(const Pieces& slots, std::string_view content,
                  std::optional<std::string_view> idx = std::nullopt) {
  Pieces out = slots;
  for (Piece& p : out) {
    if (p.kind != Piece::Kind::Text) continue;
    replaceFirst(p.text, "{{content}}", content);
    if (idx) replaceFirst(p.text, "{{idx}}", *idx);
  }
  return out;
}

void append(Pieces& to, const Pieces& from) { to.insert(to.end(), from.begin(), from.end()); }

std::string_view strip(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// ---- the registry: strings copied from LLaMA-Factory's template.py --------------------------

const char kImStartUser[] = "<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n";
const char kImAssistant[] = "{{content}}<|im_end|>\n";
const char kImSystem[] = "<|im_start|>system\n{{content}}<|im_end|>\n";
const char kQwenObservation[] =
    "<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n";

ChatTemplate::Spec qwenFamily(std::string name, std::string default_system,
                              ChatTemplate::Kind kind) {
  ChatTemplate::Spec s;
  s.name = std::move(name);
  s.format_user = {text(kImStartUser)};
  s.format_assistant = {text(kImAssistant)};
  s.format_system = {text(kImSystem)};
  s.format_observation = {text(kQwenObservation)};
  s.default_system = std::move(default_system);
  s.stop_words = {"<|im_end|>"};
  s.replace_eos = true;
  s.kind = kind;
  return s;
}

// register_template's defaults: user / system "{{content}}", assistant "{{content}}" + eos (no
// eos with efficient_eos), observation = format_user.
ChatTemplate::Spec withDefaults(ChatTemplate::Spec s) {
  if (s.format_user.empty()) s.format_user = {text("{{content}}")};
  if (s.format_assistant.empty()) {
    s.format_assistant = {text("{{content}}")};
    if (!s.efficient_eos) s.format_assistant.push_back(kEos);
  }
  if (s.format_system.empty()) s.format_system = {text("{{content}}")};
  if (s.format_observation.empty()) s.format_observation = s.format_user;
  return s;
}

std::vector<ChatTemplate> buildRegistry() {
  using Kind = ChatTemplate::Kind;
  std::vector<ChatTemplate::Spec> specs;

  specs.push_back(qwenFamily("qwen",
                             "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
                             Kind::Standard));
  specs.push_back(qwenFamily("qwen3", "", Kind::Reasoning));
  specs.push_back(qwenFamily("qwen3_nothink", "", Kind::Standard));

  ChatTemplate::Spec deepseek3;  // "<｜User｜>": U+FF5C FULLWIDTH VERTICAL LINE, as in DeepSeek-V3
  deepseek3.name = "deepseek3";
  deepseek3.format_user = {
      text("<\xEF\xBD\x9CUser\xEF\xBD\x9C>{{content}}<\xEF\xBD\x9C"
           "Assistant\xEF\xBD\x9C>")};
  deepseek3.format_prefix = {kBos};
  specs.push_back(deepseek3);

  ChatTemplate::Spec deepseek;
  deepseek.name = "deepseek";
  deepseek.format_user = {text("User: {{content}}\n\nAssistant:")};
  deepseek.format_system = {text("{{content}}\n\n")};
  deepseek.format_prefix = {kBos};
  specs.push_back(deepseek);

  ChatTemplate::Spec llama3;
  llama3.name = "llama3";
  llama3.format_user = {
      text("<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n")};
  llama3.format_assistant = {text("{{content}}<|eot_id|>")};
  llama3.format_system = {
      text("<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>")};
  llama3.format_observation = {
      text("<|start_header_id|>ipython<|end_header_id|>\n\n{{content}}<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n")};
  llama3.format_prefix = {kBos};
  llama3.stop_words = {"<|eot_id|>", "<|eom_id|>"};
  llama3.replace_eos = true;
  specs.push_back(llama3);

  ChatTemplate::Spec mistral;  // "mistral tokenizer v3"
  mistral.name = "mistral";
  mistral.format_user = {text("[INST] {{content}}[/INST]")};
  mistral.format_assistant = {text(" {{content}}"), kEos};
  mistral.format_system = {text("{{content}}\n\n")};
  mistral.format_observation = {text("[TOOL_RESULTS] {\"content\": {{content}}}[/TOOL_RESULTS]")};
  mistral.format_prefix = {kBos};
  mistral.kind = Kind::Llama2;
  specs.push_back(mistral);

  ChatTemplate::Spec def;
  def.name = "default";
  def.format_user = {text("Human: {{content}}"), kEos, text("\nAssistant:")};
  def.format_assistant = {text("{{content}}"), kEos, text("\n")};
  def.format_system = {text("System: {{content}}"), kEos, text("\n")};
  specs.push_back(def);

  ChatTemplate::Spec empty;
  empty.name = "empty";
  empty.format_assistant = {text("{{content}}")};
  specs.push_back(empty);

  std::vector<ChatTemplate> out;
  for (auto& s : specs) out.emplace_back(withDefaults(std::move(s)));
  return out;
}

const std::vector<ChatTemplate>& registry() {
  static const std::vector<ChatTemplate> templates = buildRegistry();
  return templates;
}

}  // namespace

std::string joinPieces(const Pieces& pieces, std::string_view bos_text, std::string_view eos_text) {
  std::string out;
  for (const Piece& p : pieces) {
    if (p.kind == Piece::Kind::Text)
      out += p.text;
    else if (p.kind == Piece::Kind::Bos)
      out += bos_text;
    else
      out += eos_text;
  }
  return out;
}

std::string ChatTemplate::effectiveEosToken(std::string_view tokenizer_eos_token) const {
  if (spec_.replace_eos && !spec_.stop_words.empty()) return spec_.stop_words.front();
  return std::string(tokenizer_eos_token);
}

std::string ChatTemplate::removeThought(std::string_view content) const {
  // re.sub(escape(t0) + "(.*?)" + escape(t1), "", content, flags=DOTALL).lstrip("\n")
  const std::string& t0 = spec_.thought_words.first;
  const std::string& t1 = spec_.thought_words.second;
  std::string out;
  size_t pos = 0;
  for (;;) {
    size_t open = content.find(t0, pos);
    if (open == std::string_view::npos) break;
    size_t close = content.find(t1, open + t0.size());
    if (close == std::string_view::npos) break;
    out += content.substr(pos, open - pos);
    pos = close + t1.size();
  }
  out += content.substr(pos);
  size_t first = out.find_first_not_of('\n');
  return first == std::string::npos ? std::string() : out.substr(first);
}

bool ChatTemplate::hasThought(std::string_view content) const {
  // ReasoningTemplate checks the stripped thought words: "<think>" / "</think>".
  return content.find(strip(spec_.thought_words.first)) != std::string_view::npos ||
         content.find(strip(spec_.thought_words.second)) != std::string_view::npos;
}

std::vector<Pieces> ChatTemplate::encodeMessages(const Conversation& conv) const {
  if (!conv.tools.empty())
    throw Error("tool definitions are not supported by Tandem's chat templates yet (" +
                    conv.source.file + ":" + std::to_string(conv.source.line) + ")",
                "remove the tools column from the dataset, or drop tool-calling rows");
  const std::string& system = conv.system.empty() ? spec_.default_system : conv.system;
  std::vector<Pieces> encoded;
  encoded.reserve(conv.messages.size());
  for (size_t i = 0; i < conv.messages.size(); ++i) {
    const Message& m = conv.messages[i];
    Pieces elements;
    std::string system_text;  // Llama2Template only
    if (i == 0) {
      append(elements, spec_.format_prefix);
      if (!system.empty()) {
        Pieces sys = applySlots(spec_.format_system, system);
        if (spec_.kind == Kind::Llama2)
          system_text = sys.empty() ? "" : sys.front().text;
        else
          append(elements, sys);
      }
    }
    switch (m.role) {
      case Role::User:
        if (spec_.kind == Kind::Llama2)
          append(elements, applySlots(spec_.format_user, system_text + m.content));
        else
          append(elements, applySlots(spec_.format_user, m.content, std::to_string(i / 2)));
        break;
      case Role::Assistant: append(elements, applySlots(spec_.format_assistant, m.content)); break;
      case Role::Observation:
        append(elements, applySlots(spec_.format_observation, m.content));
        break;
      case Role::FunctionCall:
        throw Error("function-call turns are not supported by Tandem's chat templates yet (" +
                        conv.source.file + ":" + std::to_string(conv.source.line) + ")",
                    "drop tool-calling rows from the dataset");
    }
    encoded.push_back(std::move(elements));
  }
  return encoded;
}

std::vector<TurnPieces> ChatTemplate::encodeTurns(const Conversation& conv) const {
  if (conv.messages.empty() || conv.messages.size() % 2 != 0)
    throw Error("a training conversation needs (prompt, response) pairs; got " +
                    std::to_string(conv.messages.size()) + " messages",
                "this is a bug in the caller: load data with loadDatasets");
  Conversation c = conv;
  const bool reasoning = spec_.kind == Kind::Reasoning;
  if (reasoning && enable_thinking_ == false)  // remove all cot
    for (size_t i = 1; i < c.messages.size(); i += 2)
      c.messages[i].content = removeThought(c.messages[i].content);

  std::vector<Pieces> encoded = encodeMessages(c);
  if (reasoning) {
    for (size_t i = 0; i + 1 < c.messages.size(); i += 2) {
      if (hasThought(c.messages[i + 1].content)) continue;
      // Add an empty cot: without thinking it is part of the prompt (no loss), with thinking
      // the model learns to emit it.
      if (!enable_thinking_.value_or(false))
        encoded[i].push_back(text(emptyThought()));
      else
        encoded[i + 1].insert(encoded[i + 1].begin(), text(emptyThought()));
    }
  }
  std::vector<TurnPieces> turns;
  for (size_t i = 0; i + 1 < encoded.size(); i += 2)
    turns.push_back({std::move(encoded[i]), std::move(encoded[i + 1])});
  return turns;
}

std::vector<std::pair<std::string, std::string>> ChatTemplate::encodePairs(
    const Conversation& conv, std::string_view bos_text, std::string_view eos_text) const {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const TurnPieces& t : encodeTurns(conv))
    pairs.emplace_back(joinPieces(t.prompt, bos_text, eos_text),
                       joinPieces(t.response, bos_text, eos_text));
  return pairs;
}

TurnPieces ChatTemplate::encodeOneTurn(const Conversation& conv) const {
  if (conv.messages.empty() || conv.messages.size() % 2 != 0)
    throw Error("encodeOneTurn needs a conversation ending with the assistant reply", "");
  Conversation c = conv;
  const bool reasoning = spec_.kind == Kind::Reasoning;
  if (reasoning) {
    // History replies lose their thoughts, as Qwen3's own chat template does.
    for (size_t i = 1; i + 2 < c.messages.size(); i += 2)
      c.messages[i].content = removeThought(c.messages[i].content);
    if (enable_thinking_ == false)
      c.messages.back().content = removeThought(c.messages.back().content);
  }
  std::vector<Pieces> encoded = encodeMessages(c);
  TurnPieces out;
  for (size_t i = 0; i + 1 < encoded.size(); ++i) append(out.prompt, encoded[i]);
  out.response = std::move(encoded.back());
  if (reasoning && !hasThought(c.messages.back().content)) {
    if (!enable_thinking_.value_or(false))
      out.prompt.push_back(text(emptyThought()));
    else
      out.response.insert(out.response.begin(), text(emptyThought()));
  }
  return out;
}

Pieces ChatTemplate::renderForGeneration(const Conversation& conv) const {
  if (conv.messages.size() % 2 != 1)
    throw Error("renderForGeneration needs a conversation that ends with a user message", "");
  Conversation c = conv;
  c.messages.push_back({Role::Assistant, ""});
  return encodeOneTurn(c).prompt;
}

const ChatTemplate& templateByName(std::string_view name) {
  for (const ChatTemplate& t : registry())
    if (t.name() == name) return t;
  std::string known;
  for (const std::string& n : templateNames()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown chat template '" + std::string(name) + "'", "known templates: " + known);
}

std::vector<std::string> templateNames() {
  std::vector<std::string> names;
  for (const ChatTemplate& t : registry()) names.push_back(t.name());
  return names;
}

}  // namespace tandem::chat
