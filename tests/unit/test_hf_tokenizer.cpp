// hf_tokenizer: the SentencePiece model reader on hand-built protobuf bytes (defaults, negative
// ids, unknown fields, truncation, a random-mutation loop that must only succeed or throw
// ft::Error), and the tokenizer.json it writes: BPE merge order, base64 charsmap, the
// normalizer for each whitespace setting, Unigram control scores. That transformers reads the
// files as ft does is tests/cli/test_export_transformers.sh.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "ckpt/hf_tokenizer.h"
#include "core/error.h"

namespace {

using nlohmann::json;

std::string varint(uint64_t v) {
  std::string out;
  do {
    uint8_t b = v & 0x7f;
    v >>= 7;
    if (v) b |= 0x80;
    out += char(b);
  } while (v);
  return out;
}
std::string field_varint(int field, int64_t v) {
  return varint(uint64_t(field) << 3) + varint(uint64_t(v));
}
std::string field_bytes(int field, const std::string& s) {
  return varint(uint64_t(field) << 3 | 2) + varint(s.size()) + s;
}
std::string field_float(int field, float f) {
  std::string out = varint(uint64_t(field) << 3 | 5);
  char b[4];
  std::memcpy(b, &f, 4);
  return out + std::string(b, 4);
}
std::string piece(const std::string& text, float score, int type) {
  return field_bytes(1, field_bytes(1, text) + field_float(2, score) + field_varint(3, type));
}

const std::string kSp = "\xe2\x96\x81";  // ▁

// A BPE model: <unk> <s> </s> control pieces, then "▁" "a" "b" "ab" "▁ab" "▁a" with scores that
// rank "ab" first, "▁ab" second, "▁a" third.
std::string bpe_model(const std::string& extra_trainer = "", const std::string& normalizer = "") {
  std::string m = piece("<unk>", 0, 2) + piece("<s>", 0, 3) + piece("</s>", 0, 3) +
                  piece(kSp, -10, 1) + piece("a", -11, 1) + piece("b", -12, 1) +
                  piece("ab", -1, 1) + piece(kSp + "ab", -2, 1) + piece(kSp + "a", -3, 1);
  m += field_bytes(2, field_varint(3, 2) + extra_trainer);
  m += field_bytes(3, field_bytes(1, "nmt_nfkc") + field_bytes(2, "abcd") + normalizer);
  return m;
}

}  // namespace

TEST_CASE("parse_sp_model: pieces, proto2 defaults, negative ids, unknown fields") {
  const std::string bytes =
      bpe_model(field_varint(43, -1) + field_varint(99, 7) + field_bytes(98, "ignored"));
  const ft::SpModelInfo sp = ft::parse_sp_model(bytes, "m.model");
  REQUIRE(sp.pieces.size() == 9);
  CHECK(sp.pieces[7].text == kSp + "ab");
  CHECK(sp.pieces[7].score == -2.0f);
  CHECK(sp.pieces[1].type == 3);
  CHECK(sp.model_type == 2);
  CHECK(sp.unk_id == 0);
  CHECK(sp.bos_id == 1);
  CHECK(sp.eos_id == 2);
  CHECK(sp.pad_id == -1);  // a 10-byte varint
  CHECK(sp.add_dummy_prefix);
  CHECK(sp.remove_extra_whitespaces);
  CHECK(sp.split_by_whitespace);
  CHECK(sp.precompiled_charsmap == "abcd");
  CHECK(ft::unsupported_sp_settings(sp).empty());

  const ft::SpModelInfo pad = ft::parse_sp_model(bpe_model(field_varint(43, 3)), "m.model");
  CHECK(pad.pad_id == 3);
  const ft::SpModelInfo digits =
      ft::parse_sp_model(bpe_model(field_varint(25, 1) + field_varint(24, 1)), "m.model");
  CHECK(ft::unsupported_sp_settings(digits) == "treat_whitespace_as_suffix, split_digits");
}

TEST_CASE("parse_sp_model: malformed input is an ft::Error naming the file") {
  const std::string good = bpe_model();
  for (size_t cut : {size_t(1), size_t(5), good.size() / 2, good.size() - 1}) {
    CAPTURE(cut);
    try {
      ft::parse_sp_model(good.substr(0, cut), "dir/tok.model");
      FAIL("no error");
    } catch (const ft::Error& e) {
      CHECK(std::string(e.what()).find("dir/tok.model: not a SentencePiece model") == 0);
    }
  }
  CHECK_THROWS_AS(ft::parse_sp_model("", "x"), ft::Error);                              // no pieces
  CHECK_THROWS_AS(ft::parse_sp_model(bpe_model(field_varint(41, 9)), "x"), ft::Error);  // bos 9
  CHECK_THROWS_AS(ft::parse_sp_model(std::string(11, '\xff'), "x"), ft::Error);  // long varint
  CHECK_THROWS_AS(ft::parse_sp_model(varint(1 << 3 | 3), "x"), ft::Error);       // group
  // Pieces appended to a sound model, so that each is refused for its own reason.
  auto refused = [&](const std::string& extra, const char* why) {
    CAPTURE(why);
    try {
      ft::parse_sp_model(good + extra, "x");
      FAIL("no error");
    } catch (const ft::Error& e) {
      CHECK(std::string(e.what()).find(why) != std::string::npos);
    }
  };
  refused(piece("a\xff", 0, 1), "piece 9 is empty or not UTF-8");
  refused(piece("\xc0\x80", 0, 1), "piece 9 is empty or not UTF-8");      // overlong NUL
  refused(piece("\xed\xa0\x80", 0, 1), "piece 9 is empty or not UTF-8");  // a surrogate
  refused(piece("", 0, 1), "piece 9 is empty or not UTF-8");
  refused(piece("a", 0, 1), "piece 9 repeats piece 4");
  refused(piece("c", std::nanf(""), 1), "piece 9 has a non-finite score");
  CHECK(ft::parse_sp_model(good + piece("\xf0\x9f\x98\x80", -5, 1), "x").pieces.size() == 10);

  // Random byte flips, cuts and insertions: a clean result or an ft::Error, nothing else.
  std::mt19937 rng(1);
  for (int i = 0; i < 3000; ++i) {
    std::string b = good;
    for (int k = 0; k < 1 + int(rng() % 4); ++k) {
      const size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0:
          b[at] = char(rng());
          break;
        case 1:
          b.resize(at + 1);
          break;
        default:
          b.insert(at, 1, char(rng()));
          break;
      }
    }
    try {
      const ft::SpModelInfo sp = ft::parse_sp_model(b, "x");
      if (ft::unsupported_sp_settings(sp).empty()) (void)ft::hf_tokenizer_json(sp);
    } catch (const ft::Error&) {
    }
  }
}

TEST_CASE("hf_tokenizer_json: BPE merges ranked by the merged piece's score, UTF-8 splits") {
  const ft::SpModelInfo sp = ft::parse_sp_model(bpe_model(), "m.model");
  const json j = json::parse(ft::hf_tokenizer_json(sp));
  CHECK(j["model"]["type"] == "BPE");
  CHECK(j["model"]["vocab"][kSp + "ab"] == 7);
  // "ab" (-1); "▁ab" (-2) from "▁"+"ab" then "▁a"+"b" (left piece id order); "▁a" (-3). No
  // split inside the 3-byte '▁', none of the control pieces.
  const json want = json::array({json::array({"a", "b"}), json::array({kSp, "ab"}),
                                 json::array({kSp + "a", "b"}), json::array({kSp, "a"})});
  CHECK(j["model"]["merges"] == want);
  CHECK(j["added_tokens"].size() == 3);
  CHECK(j["added_tokens"][1]["content"] == "<s>");
  CHECK(j["added_tokens"][1]["special"] == true);
  CHECK(j["post_processor"]["single"][0]["SpecialToken"]["id"] == "<s>");
  CHECK(j["post_processor"]["special_tokens"]["<s>"]["ids"] == json::array({1}));
  // "abcd" → base64 "YWJjZA==" (one byte past a 3-byte group: two '=').
  const json& norms = j["normalizer"]["normalizers"];
  REQUIRE(norms.size() == 4);
  CHECK(norms[0]["precompiled_charsmap"] == "YWJjZA==");
  CHECK(norms[1]["pattern"]["Regex"] == " {2,}");
  CHECK(norms[2]["pattern"]["Regex"] == "^ | $");
  CHECK(norms[3] == json({{"type", "Prepend"}, {"prepend", kSp}}));
  CHECK(j["pre_tokenizer"]["prepend_scheme"] == "never");

  const json cfg = json::parse(ft::hf_tokenizer_config_json(sp, 128));
  CHECK(cfg["tokenizer_class"] == "PreTrainedTokenizerFast");
  CHECK(cfg["pad_token"].is_null());
  CHECK(cfg["add_bos_token"] == true);
  CHECK(cfg["add_eos_token"] == false);
  CHECK(cfg["model_max_length"] == 128);
  CHECK(json::parse(ft::hf_special_tokens_map_json(sp)) ==
        json({{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}}));
}

TEST_CASE("hf_tokenizer_json: whitespace settings, no BOS, Unigram") {
  // Identity normalization (no charsmap), whitespace kept, no dummy prefix, no BOS: the
  // normalizer is empty and no post-processor adds anything.
  const std::string raw = bpe_model(field_varint(41, -1), field_varint(3, 0) + field_varint(4, 0));
  ft::SpModelInfo sp = ft::parse_sp_model(raw, "m.model");
  sp.precompiled_charsmap.clear();
  json j = json::parse(ft::hf_tokenizer_json(sp));
  CHECK(j["normalizer"].is_null());
  CHECK(j["post_processor"].is_null());
  CHECK(json::parse(ft::hf_tokenizer_config_json(sp, 8))["add_bos_token"] == false);

  // Base64 of one and two trailing bytes.
  sp.precompiled_charsmap = "a";
  CHECK(json::parse(ft::hf_tokenizer_json(
            sp))["normalizer"]["normalizers"][0]["precompiled_charsmap"] == "YQ==");
  sp.precompiled_charsmap = "abcde";
  CHECK(json::parse(ft::hf_tokenizer_json(
            sp))["normalizer"]["normalizers"][0]["precompiled_charsmap"] == "YWJjZGU=");

  // Unigram: scores kept for normal pieces, control and unknown ones far below the lowest.
  ft::SpModelInfo uni = ft::parse_sp_model(bpe_model(), "m.model");
  uni.model_type = 1;
  j = json::parse(ft::hf_tokenizer_json(uni));
  CHECK(j["model"]["type"] == "Unigram");
  CHECK(j["model"]["unk_id"] == 0);
  CHECK(j["model"]["vocab"][4] == json::array({"a", -11.0}));
  CHECK(j["model"]["vocab"][1][1].get<double>() == doctest::Approx(-1012.0));
}
