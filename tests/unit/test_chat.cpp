// chat: the mask rule of lib/data/chat.h computed from one varied rendering
// (chat_content_spans, tokenize_chat) equals the rule as written (the _reference functions,
// which render each assistant message's alternatives in full) on the committed templates and
// conversations of awkward pieces; offsets through NFC put the mask on the assistant's content;
// JSONL lines with invalid UTF-8 or bad JSON. Agreement with transformers:
// tests/cli/test_chat_data.sh.
#include <doctest/doctest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "chat_tokenizer.h"
#include "core/error.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "temp_dir.h"

namespace {

using ft::jinja::Json;

ft::ChatTemplate chat_template(const std::string& file) {
  std::ifstream in(std::string(FT_SOURCE_DIR) + "/tests/data/chat_templates/" + file);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return ft::ChatTemplate{ft::jinja::Template(s.str(), file), file,
                          Json{{"bos_token", "<s>"}, {"eos_token", "</s>"}}};
}

const char* const kTemplateFiles[] = {"llama3_instruct.jinja", "llama3_1_instruct.jinja",
                                      "qwen2_5_instruct.jinja", "qwen3.jinja",
                                      "mistral_instruct_v0_3.jinja"};

std::unique_ptr<ft::Tokenizer> chat_tokenizer(const TempDir& dir) {
  std::ofstream(dir.file("tokenizer.json")) << chat_test::tokenizer_json();
  return ft::load_tokenizer(dir.file("tokenizer.json"));
}

// Conversations of awkward pieces: special-token text, think blocks, NFC-changing text
// ("e" + U+0301), whitespace at the edges, empty contents; alternating after an optional
// system prompt (as every template takes), sometimes with tool turns.
Json random_conversation(std::mt19937& rng, bool tools) {
  static const char* pieces[] = {"a",       " ",        "\n",         "\n\n",       "word",
                                 " word",   "日本",     "😀",          "e\u0301",    "é",
                                 "<think>", "</think>", "<|im_end|>", "</s>",       "[INST]",
                                 "{{ x }}", "'",        "\"",         "\u00a0",     "Cafe\u0301",
                                 "A",       "B",        "\u0301",     "<|eot_id|>", "the"};
  auto text = [&] {
    std::string t;
    for (int n = int(rng() % 7); n > 0; --n) t += pieces[rng() % std::size(pieces)];
    return t;
  };
  Json m = Json::array();
  if (rng() % 2) m.push_back({{"role", "system"}, {"content", text()}});
  for (int turns = 1 + int(rng() % 4); turns > 0; --turns) {
    m.push_back({{"role", "user"}, {"content", text()}});
    m.push_back({{"role", "assistant"}, {"content", text()}});
    if (tools && rng() % 3 == 0) {
      m.push_back({{"role", "tool"}, {"content", text()}});
      m.push_back({{"role", "assistant"}, {"content", text()}});
    }
  }
  return m;
}

}  // namespace

TEST_CASE("chat: masks from one varied rendering equal the rule's full renderings") {
  TempDir dir;
  const auto tok = chat_tokenizer(dir);
  std::mt19937 rng(7);
  int64_t conversations = 0, fast_steps = 0, reference_steps = 0;
  for (const char* file : kTemplateFiles) {
    CAPTURE(std::string(file));
    const ft::ChatTemplate t = chat_template(file);
    const bool tools = std::string(file) != "mistral_instruct_v0_3.jinja";
    for (int n = 0; n < 60; ++n) {
      const Json messages = random_conversation(rng, tools);
      CAPTURE(messages.dump());
      const ft::ChatSpans fast = ft::chat_content_spans(t, messages);
      const ft::ChatSpans ref = ft::chat_content_spans_reference(t, messages);
      REQUIRE(fast.text == ref.text);
      CHECK(fast.spans == ref.spans);
      const ft::ChatTokens a = ft::tokenize_chat(t, *tok, messages);
      const ft::ChatTokens b = ft::tokenize_chat_reference(t, *tok, messages);
      CHECK(a.ids == b.ids);
      CHECK(a.mask == b.mask);
      CHECK(a.ids == tok->encode(ref.text));
      ++conversations;
      fast_steps += fast.steps;
      reference_steps += ref.steps;
    }
  }
  CHECK(conversations == 300);
  CHECK(fast_steps < reference_steps);
}

TEST_CASE("chat: NFC-changed text is masked by its bytes in the rendering") {
  TempDir dir;
  const auto tok = chat_tokenizer(dir);
  const ft::ChatTemplate t = chat_template("qwen2_5_instruct.jinja");
  // "e" + U+0301 becomes "é" (one token, by the merge) in every turn; the user's is not trained
  // on, the assistant's is, with the rest of its content and <|im_end|>.
  const Json messages = Json::array({Json{{"role", "system"}, {"content", "Cafe\u0301"}},
                                     Json{{"role", "user"}, {"content", "Cafe\u0301?"}},
                                     Json{{"role", "assistant"}, {"content", "e\u0301te\u0301"}}});
  const ft::ChatTokens ct = ft::tokenize_chat(t, *tok, messages);
  const std::string r = ft::render_chat(t, messages, false);
  std::vector<std::pair<size_t, size_t>> off;
  REQUIRE(tok->encode_with_offsets(r, &off) == ct.ids);
  std::string trained;
  for (size_t k = 0; k < ct.ids.size(); ++k)
    if (ct.mask[k]) trained += r.substr(off[k].first, off[k].second - off[k].first);
  CHECK(trained == "e\u0301te\u0301<|im_end|>");
  CHECK(ct.content_tokens == 3);  // é, t, é
  CHECK(ct.mask == ft::tokenize_chat_reference(t, *tok, messages).mask);
}

TEST_CASE("chat: an empty assistant message trains its end-of-turn token only") {
  TempDir dir;
  const auto tok = chat_tokenizer(dir);
  for (const char* file : kTemplateFiles) {
    CAPTURE(std::string(file));
    const Json messages = Json::array(
        {Json{{"role", "user"}, {"content", "q"}}, Json{{"role", "assistant"}, {"content", ""}}});
    const ft::ChatTokens ct = ft::tokenize_chat(chat_template(file), *tok, messages);
    CHECK(ct.content_tokens == 0);
    int trained = 0;
    for (size_t k = 0; k < ct.ids.size(); ++k) trained += ct.mask[k];
    CHECK(trained == 1);
  }
}

TEST_CASE("chat: a JSONL line: invalid UTF-8 becomes U+FFFD; bad JSON is said in a few words") {
  const Json j = ft::parse_jsonl_line("{\"text\": \"a\xFF\xE2\x82z\"}", "f.jsonl:3");
  CHECK(j["text"] == "a\uFFFD\uFFFDz");
  auto error_of = [](const std::string& line) -> std::string {
    try {
      ft::parse_jsonl_line(line, "f.jsonl:3");
    } catch (const ft::UsageError& e) {
      return e.what();
    }
    return "";
  };
  const std::string e = error_of("{\"text\": \"unterminated " + std::string(1 << 20, 'x'));
  CHECK(e.rfind("f.jsonl:3: not valid JSON (column ", 0) == 0);
  CHECK(e.find("json.exception") == std::string::npos);
  CHECK(e.size() < 400);
  const std::string bad = error_of("not json");
  CHECK(bad.find("f.jsonl:3: not valid JSON (column 2: syntax error while parsing value - "
                 "invalid literal; last read: \"no\"); JSONL needs one JSON object per "
                 "line") != std::string::npos);
  // A value quoted back (an unknown role) is quoted short.
  const Json record = {
      {"messages", Json::array({Json{{"role", std::string(1 << 20, 'r')}, {"content", "x"}}})}};
  try {
    ft::conversation_from_record(record, false, "f.jsonl:4");
    FAIL("accepted");
  } catch (const ft::UsageError& e) {
    const std::string m = e.what();
    CHECK(m.rfind("f.jsonl:4: \"messages[0].role\" is \"rrrr", 0) == 0);
    CHECK(m.size() < 200);
  }
}
