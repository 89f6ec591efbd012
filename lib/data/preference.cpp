// Preference records and pairs (preference.h).
#include "data/preference.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "core/json_describe.h"
#include "data/shard.h"

namespace ft {
namespace {

using jinja::Json;

constexpr const char* kRecordShape =
    "a preference record is {\"prompt\", \"chosen\", \"rejected\"}: three strings, or message "
    "lists";

// "a string", "a list of messages", or the JSON type of anything else, for the mixed-form error.
std::string form_name(const Json& v) {
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list of messages";
  return a_json_type(v);
}

const Json& need(const Json& record, const char* key, const std::string& where) {
  auto it = record.find(key);
  if (it == record.end() || it->is_null())
    throw UsageError(where + ": no \"" + key + "\" (" + kRecordShape + ")");
  if (!it->is_string() && !it->is_array())
    throw UsageError(where + ": \"" + key + "\" is " + a_json_type(*it) +
                     ", expected a string or a list of messages");
  return *it;
}

// A list of messages in either form (preference.h): ShareGPT when its first message has
// `from` and no `role`, as a whole record's key decides it for --format chat.
Json message_list(const Json& list, const std::string& key, const std::string& where) {
  const bool sharegpt =
      !list.empty() && list[0].is_object() && !list[0].contains("role") && list[0].contains("from");
  return parse_messages(list, key, sharegpt, where);
}

// Message `i` of the list `key` must be the completion: one assistant message.
void need_assistant(const Json& messages, size_t i, const std::string& key,
                    const std::string& where, const char* hint) {
  const std::string role = messages[i]["role"].get<std::string>();
  if (role != "assistant")
    throw UsageError(where + ": \"" + key + "[" + std::to_string(i) + "]\" is " +
                     (role == "user"     ? "a user"
                      : role == "system" ? "a system"
                                         : "a tool") +
                     " message, expected an assistant message: " + hint);
}

std::string plural(size_t n, const char* what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

}  // namespace

PreferenceRecord preference_from_record(const Json& record, const std::string& where) {
  PreferenceRecord r;
  const Json& chosen = need(record, "chosen", where);
  const Json& rejected = need(record, "rejected", where);
  const bool has_prompt = record.contains("prompt") && !record["prompt"].is_null();
  const Json* prompt = has_prompt ? &need(record, "prompt", where) : nullptr;
  // One form for the whole record: the first key that differs from the first one is named.
  const Json& first = prompt ? *prompt : chosen;
  const char* first_key = prompt ? "prompt" : "chosen";
  for (const auto& [key, v] : {std::pair<const char*, const Json*>{"chosen", &chosen},
                               std::pair<const char*, const Json*>{"rejected", &rejected}})
    if (v->is_string() != first.is_string())
      throw UsageError(where + ": \"" + key + "\" is " + form_name(*v) + " but \"" + first_key +
                       "\" is " + form_name(first) + "; " + kRecordShape +
                       ", one form for the whole record");

  if (first.is_string()) {
    if (!prompt)
      throw UsageError(where +
                       ": no \"prompt\"; string completions need the prompt as a string of its "
                       "own (only message lists may leave it out: then it is the messages "
                       "\"chosen\" and \"rejected\" both start with)");
    r.prompt = prompt->get<std::string>();
    r.chosen = chosen.get<std::string>();
    r.rejected = rejected.get<std::string>();
    return r;
  }

  r.messages = true;
  const Json chosen_messages = message_list(chosen, "chosen", where);
  const Json rejected_messages = message_list(rejected, "rejected", where);
  if (prompt) {
    // Explicit prompt: each completion is a list of one assistant message.
    const Json prompt_messages = message_list(*prompt, "prompt", where);
    r.chosen_conversation = prompt_messages;
    r.rejected_conversation = prompt_messages;
    for (const auto& [key, list, conversation] :
         {std::tuple<const char*, const Json*, Json*>{"chosen", &chosen_messages,
                                                      &r.chosen_conversation},
          std::tuple<const char*, const Json*, Json*>{"rejected", &rejected_messages,
                                                      &r.rejected_conversation}}) {
      const char* hint =
          "a completion is a list of one assistant message, [{\"role\": \"assistant\", "
          "\"content\": ...}] (the messages before it belong in \"prompt\")";
      if (list->size() != 1)
        throw UsageError(where + ": \"" + key + "\" " +
                         (list->empty() ? std::string("is an empty list")
                                        : "has " + plural(list->size(), "message")) +
                         "; " + hint);
      need_assistant(*list, 0, key, where, hint);
      conversation->push_back((*list)[0]);
    }
    return r;
  }

  // Implicit prompt: the messages both conversations start with (parsed, so a ShareGPT list and
  // a {role, content} list that say the same thing agree).
  const char* hint =
      "without \"prompt\", the prompt is the messages both start with, and each continues it "
      "with exactly one assistant message";
  for (const auto& [key, list] :
       {std::pair<const char*, const Json*>{"chosen", &chosen_messages},
        std::pair<const char*, const Json*>{"rejected", &rejected_messages}})
    if (list->empty()) throw UsageError(where + ": \"" + key + "\" is an empty list; " + hint);
  size_t shared = 0;
  while (shared < chosen_messages.size() && shared < rejected_messages.size() &&
         chosen_messages[shared] == rejected_messages[shared])
    ++shared;
  if (shared == chosen_messages.size() && shared == rejected_messages.size())
    throw UsageError(where +
                     ": \"chosen\" and \"rejected\" are the same conversation; a pair needs two "
                     "different completions");
  for (const auto& [key, list] :
       {std::pair<const char*, const Json*>{"chosen", &chosen_messages},
        std::pair<const char*, const Json*>{"rejected", &rejected_messages}}) {
    const size_t after = list->size() - shared;
    if (after != 1)
      throw UsageError(where + ": \"" + key + "\" has " +
                       (after == 0 ? std::string("no message") : plural(after, "message")) +
                       " after the " + plural(shared, "message") +
                       " that \"chosen\" and \"rejected\" both start with; " + hint);
    need_assistant(*list, shared, key, where, hint);
  }
  r.chosen_conversation = chosen_messages;
  r.rejected_conversation = rejected_messages;
  return r;
}

PreferenceTokens tokenize_preference(const PreferenceRecord& record, const Tokenizer& tok,
                                     const ChatTemplate* chat, int32_t bos_id, int32_t eos_id) {
  PreferenceTokens out;
  if (!record.messages) {
    FT_CHECK(eos_id >= 0, "tokenize_preference: text records need an EOS");
    std::vector<int32_t> prompt;
    if (bos_id >= 0) prompt.push_back(bos_id);
    const std::vector<int32_t> prompt_ids = tok.encode(record.prompt);
    prompt.insert(prompt.end(), prompt_ids.begin(), prompt_ids.end());
    for (const auto& [text, seq] :
         {std::pair<const std::string*, ChatTokens*>{&record.chosen, &out.chosen},
          std::pair<const std::string*, ChatTokens*>{&record.rejected, &out.rejected}}) {
      std::vector<int32_t> completion = tok.encode(*text);
      completion.push_back(eos_id);
      seq->ids = prompt;
      seq->ids.insert(seq->ids.end(), completion.begin(), completion.end());
      seq->mask.assign(prompt.size(), 0);
      seq->mask.resize(seq->ids.size(), 1);
      seq->content_tokens = int64_t(completion.size()) - 1;
    }
    return out;
  }
  FT_CHECK(chat != nullptr, "tokenize_preference: message records need a chat template");
  for (const auto& [key, conversation, seq] :
       {std::tuple<const char*, const Json*, ChatTokens*>{"chosen", &record.chosen_conversation,
                                                          &out.chosen},
        std::tuple<const char*, const Json*, ChatTokens*>{"rejected", &record.rejected_conversation,
                                                          &out.rejected}}) {
    try {
      *seq = tokenize_chat_last_turn(*chat, tok, *conversation);
    } catch (const UsageError& e) {
      throw UsageError(std::string("\"") + key + "\" (the prompt and it, rendered): " + e.what());
    }
    // Only a template that writes neither the content nor a special token after it gets here
    // (an empty answer under a template without end-of-turn tokens): such a sequence would add
    // nothing to the loss, and the loader would drop its pair.
    if (std::find(seq->mask.begin(), seq->mask.end(), 1) == seq->mask.end())
      throw UsageError(std::string("\"") + key +
                       "\": no token of the completion to train on (the chat template renders "
                       "no content and no end-of-turn token for it)");
  }
  return out;
}

void LengthStats::add(uint64_t n) {
  min = count ? std::min(min, n) : n;
  max = count ? std::max(max, n) : n;
  sum += n;
  ++count;
}

PreferenceLengths preference_lengths(ShardSet& set) {
  // Pairs are read a stretch of whole pairs at a time (one read for many small pairs), at least
  // one pair whatever its length.
  constexpr uint64_t kReadTokens = uint64_t(1) << 20;
  PreferenceLengths out;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  for (size_t s = 0; s < set.shards().size(); ++s) {
    const ShardInfo& info = set.shards()[s];
    FT_CHECK(info.attrs.preference, "preference_lengths on a folder of token documents");
    const std::vector<uint64_t> offsets = set.read_doc_offsets(s);
    auto doc_end = [&](size_t d) {
      return d + 1 < offsets.size() ? offsets[d + 1] : info.num_tokens;
    };
    uint64_t have_from = 0, have_to = 0;  // tokens[have_from, have_to) are in the buffers
    for (size_t d = 0; d + 1 < offsets.size(); d += 2) {
      const uint64_t from = offsets[d], to = doc_end(d + 1);
      if (to > have_to) {
        have_from = from;
        have_to = std::max(to, std::min(from + kReadTokens, info.num_tokens));
        tokens.resize(have_to - have_from);
        mask.resize(have_to - have_from);
        set.read(s, have_from, have_to - have_from, tokens.data(), mask.data());
      }
      // Each sequence's mask-0 prefix (its prompt) and the rest (its completion).
      uint64_t prompt[2], length[2];
      for (int k = 0; k < 2; ++k) {
        const uint64_t b = offsets[d + k] - have_from, e = doc_end(d + k) - have_from;
        const auto first_trained = std::find(mask.begin() + b, mask.begin() + e, 1);
        prompt[k] = uint64_t(first_trained - (mask.begin() + b));
        length[k] = e - b;
      }
      out.prompt.add(prompt[0]);
      out.chosen.add(length[0] - prompt[0]);
      out.rejected.add(length[1] - prompt[1]);
      const auto chosen_begin = tokens.begin() + (offsets[d] - have_from);
      const auto rejected_begin = tokens.begin() + (offsets[d + 1] - have_from);
      out.prompts_differ += prompt[0] != prompt[1] ||
                            !std::equal(chosen_begin, chosen_begin + prompt[0], rejected_begin);
      ++out.pairs;
    }
  }
  return out;
}

}  // namespace ft
