// Chat templates, conversations and assistant masks (chat.h).
#include "data/chat.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"
#include "core/utf8.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using jinja::Json;

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

// The common prefix of r and r' = r with `edits` applied (sorted, not overlapping), without
// building r': a stretch of r' copied from r at the position it is compared at is equal as a
// whole; only the edits' text and stretches of r that the edits shifted are compared byte by
// byte (up to the first difference).
size_t common_prefix(const std::string& r, const std::vector<jinja::Edit>& edits) {
  size_t q = 0;  // bytes matched: r'[0, q) == r[0, q)
  auto compare = [&](const char* p, size_t n) {
    for (size_t j = 0; j < n; ++j, ++q)
      if (q >= r.size() || r[q] != p[j]) return false;
    return true;
  };
  auto copy = [&](size_t from, size_t n) {
    if (from == q) {
      q += n;
      return true;
    }
    return compare(r.data() + from, n);
  };
  size_t src = 0;  // the next byte of r that r' copies
  for (const jinja::Edit& e : edits) {
    if (!copy(src, e.pos - src) || !compare(e.with.data(), e.with.size())) return q;
    src = e.pos + e.len;
  }
  copy(src, r.size() - src);
  return q;
}

// Their common suffix, at most `limit` bytes (as common_prefix, from the end).
size_t common_suffix(const std::string& r, const std::vector<jinja::Edit>& edits, size_t limit) {
  size_t q = 0;  // bytes matched at the end
  auto compare = [&](const char* p, size_t n) {
    for (size_t j = n; j > 0; --j, ++q)
      if (q >= limit || r[r.size() - 1 - q] != p[j - 1]) return false;
    return true;
  };
  auto copy = [&](size_t from, size_t n) {
    if (from + n == r.size() - q) {  // r[from, from + n) right where it is compared
      if (q + n > limit) {
        q = limit;
        return false;
      }
      q += n;
      return true;
    }
    return compare(r.data() + from, n);
  };
  size_t end = r.size();  // r' copies r[.., end) after the edit before
  for (auto it = edits.rbegin(); it != edits.rend(); ++it) {
    const size_t after = it->pos + it->len;
    if (!copy(after, end - after) || !compare(it->with.data(), it->with.size())) return q;
    end = it->pos;
  }
  copy(0, end);
  return q;
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
  if (fs::exists(config_path, ec)) {
    const std::string text =
        read_bounded_file(config_path.string(), kMaxConfigBytes, "tokenizer config");
    try {
      config = Json::parse(text);
    } catch (const Json::exception& e) {
      throw UsageError(config_path.string() + ": not valid JSON (" + json_error_words(e) + ")");
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
  if (fs::exists(jinja_path, ec)) {
    text = read_bounded_file(jinja_path.string(), kMaxTemplateBytes, "chat template");
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

namespace {

Json chat_context(const ChatTemplate& t, const Json& messages, bool add_generation_prompt) {
  Json ctx = t.special_tokens;
  ctx["messages"] = messages;
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["tools"] = nullptr;
  ctx["documents"] = nullptr;
  return ctx;
}

std::string render_context(const ChatTemplate& t, const Json& ctx, int64_t* steps) {
  try {
    return t.tmpl.render(ctx, jinja::kMaxSteps, steps);
  } catch (const jinja::TemplateError& e) {
    throw UsageError(e.what());
  }
}

// The alternatives of the mask rule (chat.h step 1).
const char* const kAlternatives[] = {"A", "B"};

// Step 2: tokens of R with their bytes, and the mask of the spans.
ChatTokens mask_tokens(const Tokenizer& tok, const ChatSpans& cs) {
  ChatTokens out;
  out.render_steps = cs.render_steps;
  out.steps = cs.steps;
  std::vector<std::pair<size_t, size_t>> off;
  out.ids = tok.encode_with_offsets(cs.text, &off);
  const size_t n = out.ids.size();
  out.mask.assign(n, 0);
  // Begins and ends never decrease (Tokenizer::encode_with_offsets), so both are searched.
  auto begins_before = [&](size_t pos) {  // the first token that begins at or after pos
    return size_t(
        std::lower_bound(off.begin(), off.end(), pos,
                         [](const std::pair<size_t, size_t>& o, size_t p) { return o.first < p; }) -
        off.begin());
  };
  for (const auto& [s, e] : cs.spans) {
    if (s < e) {
      // From the first token ending after s, while tokens begin before e.
      size_t k = size_t(std::upper_bound(off.begin(), off.end(), s,
                                         [](size_t p, const std::pair<size_t, size_t>& o) {
                                           return p < o.second;
                                         }) -
                        off.begin());
      for (; k < n && off[k].first < e; ++k) {
        out.content_tokens += !out.mask[k];
        out.mask[k] = 1;
      }
    }
    const size_t k = begins_before(e);
    if (k < n && tok.is_special(out.ids[k])) out.mask[k] = 1;
  }
  return out;
}

}  // namespace

std::string render_chat(const ChatTemplate& t, const Json& messages, bool add_generation_prompt) {
  return render_context(t, chat_context(t, messages, add_generation_prompt), nullptr);
}

ChatSpans chat_content_spans_reference(const ChatTemplate& t, const Json& messages) {
  ChatSpans cs;
  const Json ctx = chat_context(t, messages, false);
  cs.text = render_context(t, ctx, &cs.render_steps);
  cs.steps = cs.render_steps;
  const std::string& r = cs.text;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    size_t start = r.size(), min_suffix = r.size();
    for (const char* x : kAlternatives) {
      Json alt = ctx;
      alt["messages"][i]["content"] = x;
      int64_t steps = 0;
      const std::string rx = render_context(t, alt, &steps);
      cs.steps += steps;
      ++cs.full_renderings;
      const size_t p = common_prefix(r, rx);
      const size_t s = common_suffix(r, rx, std::min(r.size(), rx.size()) - p);
      start = std::min(start, p);
      min_suffix = std::min(min_suffix, s);
    }
    cs.spans.emplace_back(start, r.size() - min_suffix);
  }
  return cs;
}

namespace {

// chat_content_spans for the assistant messages from index `first` on (the others get none).
ChatSpans content_spans_from(const ChatTemplate& t, const Json& messages, size_t first) {
  const Json ctx = chat_context(t, messages, false);
  std::vector<jinja::Variation> variations;
  for (size_t i = first; i < messages.size(); ++i)
    if (messages[i]["role"] == "assistant")
      variations.push_back({Json::json_pointer("/messages/" + std::to_string(i) + "/content"),
                            {kAlternatives[0], kAlternatives[1]}});
  jinja::VariedRendering vr;
  try {
    vr = t.tmpl.render_varied(ctx, variations);
  } catch (const jinja::TemplateError& e) {
    throw UsageError(e.what());
  }
  ChatSpans cs;
  cs.text = std::move(vr.text);
  cs.render_steps = vr.render_steps;
  cs.steps = vr.steps;
  cs.full_renderings = vr.full_renderings;
  const std::string& r = cs.text;
  for (const auto& alternatives : vr.edits) {
    size_t start = r.size(), min_suffix = r.size();
    for (const std::vector<jinja::Edit>& edits : alternatives) {
      size_t rx_size = r.size();
      for (const jinja::Edit& e : edits) rx_size = rx_size - e.len + e.with.size();
      const size_t p = common_prefix(r, edits);
      const size_t s = common_suffix(r, edits, std::min(r.size(), rx_size) - p);
      start = std::min(start, p);
      min_suffix = std::min(min_suffix, s);
    }
    cs.spans.emplace_back(start, r.size() - min_suffix);
  }
  return cs;
}

}  // namespace

ChatSpans chat_content_spans(const ChatTemplate& t, const Json& messages) {
  return content_spans_from(t, messages, 0);
}

ChatTokens tokenize_chat(const ChatTemplate& t, const Tokenizer& tok, const Json& messages,
                         bool with_mask) {
  if (with_mask) return mask_tokens(tok, chat_content_spans(t, messages));
  ChatTokens out;
  const std::string r = render_context(t, chat_context(t, messages, false), &out.render_steps);
  out.steps = out.render_steps;
  out.ids = tok.encode(r);
  out.mask.assign(out.ids.size(), 1);
  return out;
}

ChatTokens tokenize_chat_last_turn(const ChatTemplate& t, const Tokenizer& tok,
                                   const Json& messages) {
  FT_CHECK(!messages.empty() && messages.back()["role"] == "assistant",
           "tokenize_chat_last_turn takes a conversation ending with an assistant message");
  // Varying only the last message gives the same span as varying all (each alternative is
  // rendered with the other messages as they are), for a fraction of the work.
  return mask_tokens(tok, content_spans_from(t, messages, messages.size() - 1));
}

std::set<int32_t> end_of_turn_ids(const ChatTemplate& t, const Tokenizer& tok) {
  Json messages = Json::array();
  messages.push_back({{"role", "user"}, {"content", "Hi"}});
  messages.push_back({{"role", "assistant"}, {"content", "Hello"}});
  const ChatTokens ct = tokenize_chat(t, tok, messages, true);
  std::set<int32_t> ids;
  for (size_t i = 0; i < ct.ids.size(); ++i)
    if (ct.mask[i] && tok.is_special(ct.ids[i])) ids.insert(ct.ids[i]);
  return ids;
}

ChatTokens tokenize_chat_reference(const ChatTemplate& t, const Tokenizer& tok,
                                   const Json& messages) {
  return mask_tokens(tok, chat_content_spans_reference(t, messages));
}

Json parse_jsonl_line(std::string_view line, const std::string& where) {
  std::string fixed;
  if (!is_valid_utf8(line)) {
    fixed = replace_invalid_utf8(line);
    line = fixed;
  }
  try {
    return Json::parse(line);
  } catch (const Json::exception& e) {
    // One line: its column is the place ("parse error at line 1, column 17: ..." says line 1).
    std::string words = json_error_words(e);
    const std::string line_one = "parse error at line 1, ";
    if (words.rfind(line_one, 0) == 0) words = words.substr(line_one.size());
    throw UsageError(where + ": not valid JSON (" + words +
                     "); JSONL needs one JSON object per line");
  }
}

namespace {

// The string at `key` of `obj` ("" when optional and absent or null); `path` names it in errors.
std::string need_string(const Json& obj, const std::string& key, const std::string& path,
                        bool optional, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (optional) return "";
    throw UsageError(where + ": no \"" + path + "\"");
  }
  if (!it->is_string())
    throw UsageError(where + ": \"" + path + "\" is " + a_json_type(*it) +
                     ", expected a string (ft reads text-only messages)");
  return it->get<std::string>();
}

}  // namespace

Json parse_messages(const Json& list, const std::string& key, bool sharegpt,
                    const std::string& where) {
  Json messages = Json::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& m = list[i];
    const std::string at = key + "[" + std::to_string(i) + "]";
    if (!m.is_object()) throw UsageError(where + ": \"" + at + "\" is not an object");
    // Keys that change what a template renders for the message, which ft does not carry.
    for (const char* k : {"tool_calls", "reasoning_content"})
      if (m.contains(k))
        throw UsageError(where + ": \"" + at + "." + k +
                         "\" is not supported (ft renders text-only messages: role and content; "
                         "fold it into the content, or drop it)");
    std::string role, content;
    if (sharegpt) {
      const std::string from = need_string(m, "from", at + ".from", false, where);
      if (from == "system")
        role = "system";
      else if (from == "human" || from == "user")
        role = "user";
      else if (from == "gpt" || from == "assistant")
        role = "assistant";
      else if (from == "tool" || from == "function" || from == "observation")
        role = "tool";
      else
        throw UsageError(where + ": \"" + at + ".from\" is " + excerpt(from, 40) +
                         "; ShareGPT roles are system, human, gpt (or user, assistant, tool, "
                         "function, observation)");
      content = need_string(m, "value", at + ".value", false, where);
    } else {
      role = need_string(m, "role", at + ".role", false, where);
      if (role != "system" && role != "user" && role != "assistant" && role != "tool")
        throw UsageError(where + ": \"" + at + ".role\" is " + excerpt(role, 40) +
                         "; roles are system, user, assistant, tool");
      content = need_string(m, "content", at + ".content", false, where);
    }
    messages.push_back({{"role", role}, {"content", content}});
  }
  return messages;
}

Json conversation_from_record(const Json& record, bool alpaca, const std::string& where) {
  Json messages = Json::array();
  if (alpaca) {
    const std::string instruction = need_string(record, "instruction", "instruction", false, where);
    const std::string input = need_string(record, "input", "input", true, where);
    const std::string output = need_string(record, "output", "output", false, where);
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
  return parse_messages(*it, list_key, sharegpt, where);
}

}  // namespace ft
