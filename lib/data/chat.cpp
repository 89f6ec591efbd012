// Chat templates, conversations and assistant masks (chat.h).
#include "data/chat.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/error.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using jinja::Json;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) FT_FAIL("cannot open ", p.string(), " for reading");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A special token of tokenizer_config.json: a string or an AddedToken object {"content": ...}.
bool token_string(const Json& j, std::string* out) {
  if (j.is_string()) {
    *out = j.get<std::string>();
    return true;
  }
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    *out = j["content"].get<std::string>();
    return true;
  }
  return false;
}

size_t common_prefix(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

size_t common_suffix(const std::string& a, const std::string& b, size_t limit) {
  size_t i = 0;
  while (i < limit && a[a.size() - 1 - i] == b[b.size() - 1 - i]) ++i;
  return i;
}

fs::path folder_of(const std::string& tokenizer_path) {
  std::error_code ec;
  return fs::is_directory(tokenizer_path, ec) ? fs::path(tokenizer_path)
                                              : fs::path(tokenizer_path).parent_path();
}

// tokenizer_config.json of the folder, or {} when it has none.
Json read_tokenizer_config(const fs::path& dir) {
  std::error_code ec;
  const fs::path config_path = dir / "tokenizer_config.json";
  Json config = Json::object();
  if (fs::is_regular_file(config_path, ec)) {
    try {
      config = Json::parse(read_file(config_path));
    } catch (const Json::parse_error& e) {
      throw UsageError(config_path.string() + ": not valid JSON (" + e.what() + ")");
    }
    if (!config.is_object()) throw UsageError(config_path.string() + ": expected a JSON object");
  }
  return config;
}

Json special_tokens_of(const Json& config) {
  Json out = Json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    std::string v;
    if (config.contains(key) && token_string(config[key], &v)) out[key] = v;
  }
  return out;
}

}  // namespace

Json load_special_tokens(const std::string& tokenizer_path) {
  return special_tokens_of(read_tokenizer_config(folder_of(tokenizer_path)));
}

ChatTemplate load_chat_template(const std::string& tokenizer_path) {
  std::error_code ec;
  const fs::path dir = folder_of(tokenizer_path);
  const fs::path config_path = dir / "tokenizer_config.json";
  const Json config = read_tokenizer_config(dir);
  std::string text, source;
  const fs::path jinja_path = dir / "chat_template.jinja";
  if (fs::is_regular_file(jinja_path, ec)) {
    text = read_file(jinja_path);
    source = jinja_path.string();
  } else if (config.contains("chat_template")) {
    const Json& ct = config["chat_template"];
    source = config_path.string() + ": chat_template";
    if (ct.is_string()) {
      text = ct.get<std::string>();
    } else if (ct.is_array()) {
      bool found = false;
      for (const Json& t : ct)
        if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
            t["template"].is_string()) {
          text = t["template"].get<std::string>();
          found = true;
        }
      if (!found) throw UsageError(source + ": a list of templates without one named \"default\"");
      source += "[default]";
    } else {
      throw UsageError(source + ": expected a string or a list of {name, template}");
    }
  } else {
    throw UsageError(dir.string() +
                     ": no chat template (looked for chat_template.jinja and the chat_template "
                     "key of tokenizer_config.json); --format chat and alpaca render "
                     "conversations with the model's own template");
  }
  std::unique_ptr<jinja::Template> parsed;
  try {
    parsed = std::make_unique<jinja::Template>(text, source);
  } catch (const jinja::TemplateError& e) {
    throw UsageError(e.what());
  }
  return ChatTemplate{std::move(*parsed), source, special_tokens_of(config)};
}

std::string render_chat(const ChatTemplate& t, const Json& messages, bool add_generation_prompt) {
  Json ctx = t.special_tokens;
  ctx["messages"] = messages;
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["tools"] = nullptr;
  ctx["documents"] = nullptr;
  try {
    return t.tmpl.render(ctx);
  } catch (const jinja::TemplateError& e) {
    throw UsageError(e.what());
  }
}

ChatTokens tokenize_chat(const ChatTemplate& t, const Tokenizer& tok, const Json& messages,
                         bool with_mask) {
  const std::string r = render_chat(t, messages, false);
  ChatTokens out;
  out.ids = tok.encode(r);
  out.mask.assign(out.ids.size(), with_mask ? 0 : 1);
  if (!with_mask) return out;

  // Content spans (chat.h, step 1).
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    size_t start = r.size(), min_suffix = r.size();
    for (const char* x : {"A", "B"}) {
      Json alt = messages;
      alt[i]["content"] = x;
      const std::string rx = render_chat(t, alt, false);
      const size_t p = common_prefix(r, rx);
      const size_t s = common_suffix(r, rx, std::min(r.size(), rx.size()) - p);
      start = std::min(start, p);
      min_suffix = std::min(min_suffix, s);
    }
    spans.emplace_back(start, r.size() - min_suffix);
  }

  // Token byte offsets: each token's bytes, in order, make up R.
  std::vector<size_t> off(out.ids.size() + 1, 0);
  for (size_t k = 0; k < out.ids.size(); ++k) {
    const std::string piece = tok.decode({out.ids[k]});
    if (r.compare(off[k], piece.size(), piece) != 0)
      FT_FAIL(tok.path(), ": the tokens of a rendered conversation do not spell its text at byte ",
              off[k],
              ", so assistant tokens cannot be located; chat data needs a tokenizer "
              "whose tokens decode to the exact text (byte-level BPE without normalizer "
              "changes or stripped added tokens)");
    off[k + 1] = off[k] + piece.size();
  }
  if (off.back() != r.size())
    FT_FAIL(tok.path(), ": the tokens of a rendered conversation do not spell its text");

  // Step 2: overlap, then the end-of-turn token.
  const size_t n = out.ids.size();
  for (const auto& [s, e] : spans) {
    if (s < e) {
      // From the token holding byte s, while tokens start before e.
      size_t k = size_t(std::upper_bound(off.begin(), off.end(), s) - off.begin()) - 1;
      for (; k < n && off[k] < e; ++k) out.mask[k] = 1;
    }
    const size_t k = size_t(std::lower_bound(off.begin(), off.begin() + n, e) - off.begin());
    if (k < n && tok.is_special(out.ids[k])) out.mask[k] = 1;
  }
  return out;
}

Json conversation_from_record(const Json& record, bool alpaca, const std::string& where) {
  auto need_string = [&](const Json& obj, const std::string& key, const std::string& path,
                         bool optional) -> std::string {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      if (optional) return "";
      throw UsageError(where + ": no \"" + path + "\"");
    }
    if (!it->is_string())
      throw UsageError(where + ": \"" + path + "\" is a " + it->type_name() +
                       ", expected a string (ft reads text-only messages)");
    return it->get<std::string>();
  };
  Json messages = Json::array();
  if (alpaca) {
    const std::string instruction = need_string(record, "instruction", "instruction", false);
    const std::string input = need_string(record, "input", "input", true);
    const std::string output = need_string(record, "output", "output", false);
    messages.push_back({{"role", "user"},
                        {"content", input.empty() ? instruction : instruction + "\n\n" + input}});
    messages.push_back({{"role", "assistant"}, {"content", output}});
    return messages;
  }
  const bool sharegpt = !record.contains("messages") && record.contains("conversations");
  const char* list_key = sharegpt ? "conversations" : "messages";
  auto it = record.find(list_key);
  if (it == record.end())
    throw UsageError(where +
                     ": no \"messages\" (a list of {role, content}) or \"conversations\" "
                     "(ShareGPT: a list of {from, value}); for instruction/input/output records "
                     "use --format alpaca");
  if (!it->is_array() || it->empty())
    throw UsageError(where + ": \"" + list_key + "\" must be a non-empty list");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    const std::string at = std::string(list_key) + "[" + std::to_string(i) + "]";
    if (!m.is_object()) throw UsageError(where + ": \"" + at + "\" is not an object");
    // Keys that change what a template renders for the message, which ft does not carry.
    for (const char* key : {"tool_calls", "reasoning_content"})
      if (m.contains(key))
        throw UsageError(where + ": \"" + at + "." + key +
                         "\" is not supported (ft renders text-only messages: role and content; "
                         "fold it into the content, or drop it)");
    std::string role, content;
    if (sharegpt) {
      const std::string from = need_string(m, "from", at + ".from", false);
      if (from == "system")
        role = "system";
      else if (from == "human" || from == "user")
        role = "user";
      else if (from == "gpt" || from == "assistant")
        role = "assistant";
      else if (from == "tool" || from == "function" || from == "observation")
        role = "tool";
      else
        throw UsageError(where + ": \"" + at + ".from\" is \"" + from +
                         "\"; ShareGPT roles are system, human, gpt (or user, assistant, tool, "
                         "function, observation)");
      content = need_string(m, "value", at + ".value", false);
    } else {
      role = need_string(m, "role", at + ".role", false);
      if (role != "system" && role != "user" && role != "assistant" && role != "tool")
        throw UsageError(where + ": \"" + at + ".role\" is \"" + role +
                         "\"; roles are system, user, assistant, tool");
      content = need_string(m, "content", at + ".content", false);
    }
    messages.push_back({{"role", role}, {"content", content}});
  }
  return messages;
}

}  // namespace ft
