// Chat data for supervised fine-tuning (DESIGN.md §6 "Chat data"): conversations rendered
// with the model's own chat template (lib/data/jinja.h), tokenized, and masked so that only
// the assistant's tokens are trained on.
//
// Mask rule, for each assistant message i of a conversation with rendering R:
//   1. R_A and R_B are the renderings with message i's content replaced by "A" and by "B".
//      For X in {A, B}: p_X = the common prefix of R and R_X in bytes, s_X = their common
//      suffix, at most min(|R|, |R_X|) - p_X. The content span of message i is
//      [min p_X, |R| - min s_X): the bytes of R that depend on that content, however the
//      template places or transforms it (trim, a system prompt moved into the last user turn,
//      Qwen3's think blocks).
//   2. R is tokenized once (no BOS/EOS added: the template writes its own), each token with
//      the bytes of R it stands for (Tokenizer::encode_with_offsets: where NFC changed the
//      text, the whole changed stretch). A token is trained on when its bytes overlap a content
//      span (so a token straddling a span's edge, e.g. Mistral's " " + content merged into one
//      token, is trained on), or when it is the first token starting at or after a span's end
//      and is a special token (the end-of-turn token: <|eot_id|>, <|im_end|>, </s>).
//
// Step 1 as written renders the conversation twice more per assistant message, quadratic in the
// conversation's length; chat_content_spans gets the same spans from one rendering with
// variations (jinja::Template::render_varied: linear for the templates ft is tested with, the
// renderings of a message in full only where the template decides something on its content,
// such as Qwen3's think blocks). chat_content_spans_reference keeps the rule as written, the
// oracle of the tests and of tests/fuzz/fuzz_chat.cpp.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "data/jinja.h"
#include "data/tokenizer.h"

namespace ft {

struct ChatTemplate {
  jinja::Template tmpl;
  std::string source;  // where it was read: chat_template.jinja or tokenizer_config.json
  jinja::Json special_tokens = jinja::Json::object();  // bos_token, eos_token, ... as strings
};

// The chat template of the tokenizer `tokenizer_path` names (a Hugging Face folder, or a
// tokenizer.json whose folder holds the rest): chat_template.jinja if the folder has one,
// else tokenizer_config.json's `chat_template` (a string, or a list of {name, template} of
// which "default" is used). Special tokens (bos_token, eos_token, unk_token, pad_token) come
// from tokenizer_config.json, as strings or {"content": ...} objects. Throws UsageError when
// there is none, naming what was looked for.
ChatTemplate load_chat_template(const std::string& tokenizer_path);

// bos_token, eos_token, unk_token and pad_token of tokenizer_config.json in the folder of
// `tokenizer_path` (as load_chat_template finds it), as strings; {} without the file.
jinja::Json load_special_tokens(const std::string& tokenizer_path);

// The template rendered on `messages` (a JSON list of {role, content}), as transformers'
// apply_chat_template(tokenize=False) renders it: messages, add_generation_prompt, tools =
// none, documents = none, and the special tokens as variables.
std::string render_chat(const ChatTemplate& t, const jinja::Json& messages,
                        bool add_generation_prompt);

// The rendering R of a conversation and the content span of each assistant message in it
// (step 1), with the renderer's work.
struct ChatSpans {
  std::string text;                              // R
  std::vector<std::pair<size_t, size_t>> spans;  // [start, end) per assistant message
  int64_t render_steps = 0;                      // jinja steps of rendering R once
  int64_t steps = 0;            // jinja steps of all the work (render_varied's steps)
  int64_t full_renderings = 0;  // renderings of a variation in full
};
ChatSpans chat_content_spans(const ChatTemplate& t, const jinja::Json& messages);
ChatSpans chat_content_spans_reference(const ChatTemplate& t, const jinja::Json& messages);

struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;   // (ids.size()) 1 = trained on (the rule above)
  int64_t content_tokens = 0;  // tokens overlapping a content span (not the end-of-turn ones)
  int64_t render_steps = 0, steps = 0;  // as ChatSpans (with_mask false: one rendering)
};

// Renders and tokenizes one conversation with the mask rule above (with_mask false: mask all
// ones, without the work the rule needs). Throws UsageError for an input error (the template
// raised, or took too long), naming no record (the caller does).
ChatTokens tokenize_chat(const ChatTemplate& t, const Tokenizer& tok, const jinja::Json& messages,
                         bool with_mask = true);
// As tokenize_chat, with the mask of the conversation's last message alone (an assistant
// message: a preference pair's completion, DESIGN.md §6 "Preference data"); the assistant
// messages before it are not trained on (mask 0), like the rest of the prompt.
ChatTokens tokenize_chat_last_turn(const ChatTemplate& t, const Tokenizer& tok,
                                   const jinja::Json& messages);

// The token ids that end an assistant's turn under the template: the special tokens the mask rule
// trains on after an assistant message's content (e.g. <|im_end|>, <|eot_id|>), as a user turn
// "Hi" and an assistant's "Hello" render. Empty when the template ends a turn with no special
// token. Throws as tokenize_chat does.
std::set<int32_t> end_of_turn_ids(const ChatTemplate& t, const Tokenizer& tok);

// The same from chat_content_spans_reference.
ChatTokens tokenize_chat_reference(const ChatTemplate& t, const Tokenizer& tok,
                                   const jinja::Json& messages);

// One JSONL record as a conversation (a JSON list of {role, content} with string contents):
//   chat    `messages` (role: system|user|assistant|tool, content), or ShareGPT's
//           `conversations` (from: system|human|user|gpt|assistant|tool|function|observation,
//           value), mapped to those roles
//   alpaca  instruction, input, output -> user: instruction, or instruction + "\n\n" + input
//           when input is non-empty; assistant: output
// Other keys of a message are ignored, except tool_calls and reasoning_content, which change
// what templates render and are refused. Throws UsageError naming `where` (file:line) and the
// key, with a hint.
jinja::Json conversation_from_record(const jinja::Json& record, bool alpaca,
                                     const std::string& where);

// A JSON list of messages as conversation_from_record reads `messages` ({role, content}) or,
// with `sharegpt`, `conversations` ({from, value}); `key` names the list in errors
// ("prompt[2].role"). May be empty (the caller says whether that is allowed).
jinja::Json parse_messages(const jinja::Json& list, const std::string& key, bool sharegpt,
                           const std::string& where);

// One line of a JSONL file as JSON (any type: the caller checks it is an object). Invalid
// UTF-8 is first replaced, each maximal invalid subpart by U+FFFD (as Python's
// bytes.decode("utf-8", errors="replace")). Not JSON: UsageError "<where>: not valid JSON at
// column C: <what is wrong, in words> near <an excerpt of at most ~40 characters>; JSONL needs
// one JSON object per line".
jinja::Json parse_jsonl_line(std::string_view line, const std::string& where);

}  // namespace ft
