// data/preference: records of the three forms (lib/data/preference.h) and their errors, text
// pairs' tokens and masks, message pairs' masks (the chat rule for the last message alone, from
// varying that message only) against the rule's full renderings, and the lengths ft inspect
// reports. Agreement with transformers: tests/cli/test_preference_data.sh.
#include <doctest/doctest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "chat_tokenizer.h"
#include "core/error.h"
#include "data/preference.h"
#include "data/shard.h"
#include "temp_dir.h"

namespace {

using ft::jinja::Json;

doctest::Contains has(const std::string& s) { return doctest::Contains(s.c_str()); }

Json messages(std::initializer_list<std::pair<const char*, const char*>> turns) {
  Json m = Json::array();
  for (const auto& [role, content] : turns) m.push_back({{"role", role}, {"content", content}});
  return m;
}

ft::ChatTemplate chat_template(const std::string& file) {
  std::ifstream in(std::string(FT_SOURCE_DIR) + "/tests/data/chat_templates/" + file);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return ft::ChatTemplate{ft::jinja::Template(s.str(), file), file,
                          Json{{"bos_token", "<s>"}, {"eos_token", "</s>"}}};
}

std::unique_ptr<ft::Tokenizer> chat_tokenizer(const TempDir& dir) {
  std::ofstream(dir.file("tokenizer.json")) << chat_test::tokenizer_json();
  return ft::load_tokenizer(dir.file("tokenizer.json"));
}

// The message a record is refused with (empty when it is not).
std::string refusal(const std::string& record) {
  try {
    ft::preference_from_record(Json::parse(record), "f.jsonl:7");
  } catch (const ft::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("data/preference: records of the three forms") {
  SUBCASE("strings") {
    const ft::PreferenceRecord r = ft::preference_from_record(
        Json::parse(R"({"prompt": "p", "chosen": "c", "rejected": "r", "other": 1})"), "w");
    CHECK(!r.messages);
    CHECK(r.prompt == "p");
    CHECK(r.chosen == "c");
    CHECK(r.rejected == "r");
  }
  SUBCASE("a prompt list and one-message completions, ShareGPT in some keys") {
    const ft::PreferenceRecord r = ft::preference_from_record(Json::parse(R"({
        "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        "chosen": [{"from": "gpt", "value": "c"}],
        "rejected": [{"role": "assistant", "content": "r"}]})"),
                                                              "w");
    CHECK(r.messages);
    CHECK(r.chosen_conversation == messages({{"system", "s"}, {"user", "u"}, {"assistant", "c"}}));
    CHECK(r.rejected_conversation ==
          messages({{"system", "s"}, {"user", "u"}, {"assistant", "r"}}));
  }
  SUBCASE("an implicit prompt: the messages both start with") {
    const ft::PreferenceRecord r = ft::preference_from_record(Json::parse(R"({
        "chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                   {"role": "user", "content": "q2"}, {"role": "assistant", "content": "c"}],
        "rejected": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
                     {"from": "human", "value": "q2"}, {"from": "gpt", "value": "r"}]})"),
                                                              "w");
    CHECK(r.messages);
    CHECK(r.chosen_conversation.size() == 4);
    CHECK(r.rejected_conversation ==
          messages({{"user", "q"}, {"assistant", "a"}, {"user", "q2"}, {"assistant", "r"}}));
  }
  SUBCASE("an empty prompt") {
    const ft::PreferenceRecord r = ft::preference_from_record(
        Json::parse(R"({"prompt": [], "chosen": [{"role": "assistant", "content": "c"}],
                        "rejected": [{"role": "assistant", "content": "r"}]})"),
        "w");
    CHECK(r.chosen_conversation == messages({{"assistant", "c"}}));
  }
}

TEST_CASE("data/preference: a bad record is refused naming the record and the key") {
  const std::string a = R"([{"role": "assistant", "content": "a"}])";
  const std::string u = R"([{"role": "user", "content": "u"}])";
  const std::string ua =
      R"([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}])";
  struct Case {
    std::string record, want;
  };
  const Case cases[] = {
      {R"({"prompt": "p", "rejected": "r"})", "f.jsonl:7: no \"chosen\""},
      {R"({"prompt": "p", "chosen": null, "rejected": "r"})", "f.jsonl:7: no \"chosen\""},
      {R"({"prompt": "p", "chosen": "c"})", "f.jsonl:7: no \"rejected\""},
      {R"({"prompt": {}, "chosen": "c", "rejected": "r"})",
       "f.jsonl:7: \"prompt\" is an object, expected a string or a list of messages"},
      {R"({"prompt": "p", "chosen": )" + a + R"(, "rejected": "r"})",
       "f.jsonl:7: \"chosen\" is a list of messages but \"prompt\" is a string"},
      {R"({"prompt": )" + u + R"(, "chosen": )" + a + R"(, "rejected": "r"})",
       "f.jsonl:7: \"rejected\" is a string but \"prompt\" is a list of messages"},
      {R"({"chosen": "c", "rejected": "r"})", "f.jsonl:7: no \"prompt\"; string completions"},
      {R"({"prompt": [{"role": "user", "content": ["x"]}], "chosen": )" + a + R"(, "rejected": )" +
           a + "}",
       "f.jsonl:7: \"prompt[0].content\" is an array, expected a string"},
      {R"({"prompt": )" + u + R"(, "chosen": [], "rejected": )" + a + "}",
       "f.jsonl:7: \"chosen\" is an empty list; a completion is a list of one assistant message"},
      {R"({"prompt": )" + u + R"(, "chosen": )" + a + R"(, "rejected": )" + ua + "}",
       "f.jsonl:7: \"rejected\" has 2 messages; a completion is a list of one"},
      {R"({"prompt": )" + u + R"(, "chosen": [{"from": "human", "value": "x"}], "rejected": )" + a +
           "}",
       "f.jsonl:7: \"chosen[0]\" is a user message, expected an assistant message"},
      {R"({"chosen": )" + ua + R"(, "rejected": )" + ua + "}",
       "f.jsonl:7: \"chosen\" and \"rejected\" are the same conversation"},
      {R"({"chosen": )" + ua + R"(, "rejected": )" + u + "}",
       "f.jsonl:7: \"rejected\" has no message after the 1 message that"},
      {R"({"chosen": [], "rejected": )" + a + "}", "f.jsonl:7: \"chosen\" is an empty list"},
      {R"({"chosen": )" + ua +
           R"(, "rejected": [{"role": "user", "content": "v"}, {"role": "assistant", "content": "b"}]})",
       "f.jsonl:7: \"chosen\" has 2 messages after the 0 messages that"},
      {R"({"chosen": [{"role": "system", "content": "s"}, {"role": "user", "content": "c"}],
           "rejected": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "r"}]})",
       "f.jsonl:7: \"chosen[1]\" is a user message, expected an assistant message"},
      {R"({"prompt": )" + u + R"(, "chosen": )" + a +
           R"(, "rejected": [{"role": "assistant", "content": "", "tool_calls": []}]})",
       "f.jsonl:7: \"rejected[0].tool_calls\" is not supported"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.record);
    CHECK_MESSAGE(refusal(c.record).find(c.want) != std::string::npos, refusal(c.record));
  }
}

TEST_CASE("data/preference: text pairs are BOS + prompt, then the completion + EOS") {
  TempDir dir;
  const auto tok = chat_tokenizer(dir);
  ft::PreferenceRecord r;
  r.prompt = "the word";
  r.chosen = " the answer";
  r.rejected = "";
  const int32_t bos = 300, eos = 301;
  for (const int32_t b : {bos, int32_t(-1)}) {
    CAPTURE(b);
    const ft::PreferenceTokens p = ft::tokenize_preference(r, *tok, nullptr, b, eos);
    std::vector<int32_t> prompt = tok->encode(r.prompt);
    if (b >= 0) prompt.insert(prompt.begin(), b);
    std::vector<int32_t> want = prompt;
    for (int32_t id : tok->encode(r.chosen)) want.push_back(id);
    want.push_back(eos);
    CHECK(p.chosen.ids == want);
    std::vector<uint8_t> mask(prompt.size(), 0);
    mask.resize(want.size(), 1);
    CHECK(p.chosen.mask == mask);
    // An empty completion is its EOS alone.
    want = prompt;
    want.push_back(eos);
    CHECK(p.rejected.ids == want);
    mask.assign(prompt.size(), 0);
    mask.push_back(1);
    CHECK(p.rejected.mask == mask);
  }
}

TEST_CASE("data/preference: a message pair's mask is the chat rule for its last message alone") {
  TempDir dir;
  const auto tok = chat_tokenizer(dir);
  std::mt19937 rng(11);
  static const char* pieces[] = {"a",
                                 " ",
                                 "\n",
                                 "word",
                                 "日本",
                                 "e\u0301",
                                 "<|im_end|>",
                                 "</s>",
                                 "A",
                                 "B",
                                 "<think>x</think>",
                                 "the",
                                 ""};
  auto text = [&] {
    std::string t;
    for (int n = int(rng() % 5); n > 0; --n) t += pieces[rng() % std::size(pieces)];
    return t;
  };
  int trained_earlier = 0;  // conversations where the chat mask trains an earlier assistant turn
  for (const char* file : {"llama3_instruct.jinja", "qwen2_5_instruct.jinja", "qwen3.jinja",
                           "mistral_instruct_v0_3.jinja"}) {
    CAPTURE(std::string(file));
    const ft::ChatTemplate t = chat_template(file);
    for (int n = 0; n < 25; ++n) {
      ft::PreferenceRecord r;
      r.messages = true;
      Json prompt = Json::array();
      if (rng() % 2) prompt.push_back({{"role", "system"}, {"content", text()}});
      for (int turns = int(rng() % 3); turns > 0; --turns) {
        prompt.push_back({{"role", "user"}, {"content", text()}});
        prompt.push_back({{"role", "assistant"}, {"content", text()}});
      }
      prompt.push_back({{"role", "user"}, {"content", text()}});
      r.chosen_conversation = prompt;
      r.chosen_conversation.push_back({{"role", "assistant"}, {"content", text()}});
      r.rejected_conversation = prompt;
      r.rejected_conversation.push_back({{"role", "assistant"}, {"content", text()}});
      const ft::PreferenceTokens p = ft::tokenize_preference(r, *tok, &t, -1, -1);
      for (const auto& [conv, seq] :
           {std::pair<const Json*, const ft::ChatTokens*>{&r.chosen_conversation, &p.chosen},
            std::pair<const Json*, const ft::ChatTokens*>{&r.rejected_conversation, &p.rejected}}) {
        CAPTURE(conv->dump());
        // The rule as written (every assistant message's span from full renderings), then the
        // last span alone applied to the tokens.
        const ft::ChatSpans ref = ft::chat_content_spans_reference(t, *conv);
        const ft::ChatTokens all = ft::tokenize_chat_reference(t, *tok, *conv);
        REQUIRE(seq->ids == all.ids);
        std::vector<std::pair<size_t, size_t>> off;
        tok->encode_with_offsets(ref.text, &off);
        const auto [s, e] = ref.spans.back();
        std::vector<uint8_t> want(off.size(), 0);
        bool end_of_turn = false;
        for (size_t k = 0; k < off.size(); ++k) {
          if (s < e && off[k].first < e && off[k].second > s) want[k] = 1;
          if (!end_of_turn && off[k].first >= e) {
            end_of_turn = true;
            want[k] = tok->is_special(seq->ids[k]);
          }
        }
        CHECK(seq->mask == want);
        trained_earlier += all.mask != want;
      }
    }
  }
  CHECK(trained_earlier > 0);  // the prompts' assistant turns made a difference somewhere
}

TEST_CASE("data/preference: a completion with no token to train on is refused, naming its key") {
  TempDir dir;
  const auto tok = chat_tokenizer(dir);
  // A template that writes no end-of-turn token: an empty answer leaves nothing to train on.
  const ft::ChatTemplate t{
      ft::jinja::Template("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
                          "plain"),
      "plain", Json::object()};
  ft::PreferenceRecord r;
  r.messages = true;
  r.chosen_conversation = messages({{"user", "q"}, {"assistant", "an answer"}});
  r.rejected_conversation = messages({{"user", "q"}, {"assistant", ""}});
  CHECK_THROWS_WITH_AS(ft::tokenize_preference(r, *tok, &t, -1, -1),
                       has("\"rejected\": no token of the completion to train on"), ft::UsageError);
}

TEST_CASE("data/preference: lengths of prompts and completions over a shard folder") {
  TempDir dir;
  ft::ShardAttributes a;
  a.preference = true;
  a.vocab_size = 100;
  a.tokenizer_sha256 = std::string(64, 'a');
  ft::ShardWriter::Options opt;
  opt.loss_mask = true;
  opt.chunk_tokens = 3;  // pairs across chunks
  // Pairs of (tokens, mask): prompt lengths 2, 0, 3; chosen completions 3, 1, 2; rejected 1, 4,
  // 2 (the third's rejected prompt differs from its chosen one's).
  const std::vector<std::pair<std::vector<int32_t>, std::vector<uint8_t>>> docs = {
      {{1, 5, 6, 7, 2}, {0, 0, 1, 1, 1}},
      {{1, 5, 2}, {0, 0, 1}},
      {{9}, {1}},
      {{8, 8, 8, 2}, {1, 1, 1, 1}},
      {{1, 4, 4, 7, 2}, {0, 0, 0, 1, 1}},
      {{1, 4, 3, 7, 2}, {0, 0, 0, 1, 1}}};
  for (int shard = 0; shard < 2; ++shard) {
    ft::ShardWriter w(dir.file("shard_0000" + std::to_string(shard) + ".h5"), a, opt);
    for (size_t d = shard == 0 ? 0 : 4; d < (shard == 0 ? 4u : 6u); ++d)
      w.add_document(docs[d].first, &docs[d].second);
    w.close();
  }
  ft::ShardSet set(dir.path);
  const ft::PreferenceLengths st = ft::preference_lengths(set);
  CHECK(st.pairs == 3);
  CHECK(st.prompt.min == 0);
  CHECK(st.prompt.max == 3);
  CHECK(st.prompt.mean() == doctest::Approx(5.0 / 3));
  CHECK(st.chosen.min == 1);
  CHECK(st.chosen.max == 3);
  CHECK(st.chosen.sum == 6);
  CHECK(st.rejected.min == 1);
  CHECK(st.rejected.max == 4);
  CHECK(st.rejected.sum == 7);
  CHECK(st.prompts_differ == 1);
}
