// bpe_tokenizer: byte-level BPE read from a hand-built tokenizer.json, the cases small enough to
// state by hand: merge order (rank first, leftmost among equal ranks), the two merge forms,
// ignore_merges, bytes outside the vocabulary (dropped, unk, fuse_unk), added tokens (lstrip,
// rstrip, single_word, leftmost-longest), decode as the inverse of encode, invalid UTF-8
// replaced by U+FFFD, BOS/EOS from the template, and errors that name the key. Agreement with
// Hugging Face `tokenizers` on trained tokenizers and awkward text is
// tests/cli/test_tokenizer_json.sh.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"
#include "temp_dir.h"

namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// The byte-level text of a raw byte string (GPT-2's bytes_to_unicode, written out again here).
std::string byte_level(const std::string& raw) {
  std::string out;
  for (unsigned char b : raw) {
    uint32_t cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
      uint32_t n = 0;  // rank of b among the non-printable bytes
      for (uint32_t c = 0; c < b; ++c)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++n;
      cp = 256 + n;
    }
    if (cp < 0x80) {
      out += char(cp);
    } else {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

// Ids 0..255: the single bytes; then these merges, each making the next id.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"b", "c"}, {"a", "a"}, {"a", "b"}, {" ", "a"}, {"ab", "c"}, {"w", "o"}, {"wo", "w"}};
constexpr int32_t kBC = 256, kAA = 257, kAB = 258, kSpA = 259, kABC = 260, kWOW = 262;
constexpr int32_t kXYZ = 263;                            // in the vocabulary, but no merge makes it
constexpr int32_t kS = 264, kMask = 265, kWowTok = 266;  // added tokens

json base_tokenizer(bool string_merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level(std::string(1, char(b)))] = b;
  json merges = json::array();
  int32_t id = 256;
  for (const auto& [l, r] : kMerges) {
    vocab[byte_level(l + r)] = id++;
    if (string_merges)
      merges.push_back(byte_level(l) + " " + byte_level(r));
    else
      merges.push_back(json::array({byte_level(l), byte_level(r)}));
  }
  vocab["xyz"] = kXYZ;
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = json::array();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},     {"unk_token", nullptr},
                {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab},
                {"merges", merges}};
  return j;
}

json added(int32_t id, const std::string& content, bool special, bool lstrip, bool rstrip,
           bool single_word) {
  return {
      {"id", id},         {"content", content},         {"special", special},    {"lstrip", lstrip},
      {"rstrip", rstrip}, {"single_word", single_word}, {"normalized", !special}};
}

std::unique_ptr<ft::Tokenizer> load(const TempDir& dir, const json& j,
                                    const std::string& name = "tokenizer.json") {
  std::ofstream(dir.file(name)) << j.dump();
  return ft::load_tokenizer(dir.file(name));
}

}  // namespace

TEST_CASE("bpe_tokenizer: merges by rank, leftmost among equal ranks; both merge forms") {
  TempDir dir;
  for (bool string_merges : {true, false}) {
    CAPTURE(string_merges);
    auto tok = load(dir, base_tokenizer(string_merges));
    CHECK(tok->vocab_size() == kXYZ + 1);
    CHECK(tok->bos_id() == -1);
    CHECK(tok->eos_id() == -1);
    CHECK(tok->encode("aaa") == Ids{kAA, 'a'});  // one rank: the leftmost pair first
    CHECK(tok->encode("aaaa") == Ids{kAA, kAA});
    CHECK(tok->encode("abc") == Ids{'a', kBC});  // "b c" outranks "a b"
    CHECK(tok->encode("aab") == Ids{kAA, 'b'});  // "a a" outranks "a b"
    CHECK(tok->encode("abd") == Ids{kAB, 'd'});
    CHECK(tok->encode("wow") == Ids{kWOW});           // merges build on merges
    CHECK(tok->encode("a a") == Ids{'a', kSpA});      // GPT-2 regex: "a", " a"
    CHECK(tok->encode("xyz") == Ids{'x', 'y', 'z'});  // no merge makes "xyz"
    CHECK(tok->encode("") == Ids{});
  }
}

TEST_CASE("bpe_tokenizer: ignore_merges takes a whole piece found in the vocabulary") {
  TempDir dir;
  json j = base_tokenizer(false);
  j["model"]["ignore_merges"] = true;
  auto tok = load(dir, j);
  CHECK(tok->encode("xyz") == Ids{kXYZ});
  CHECK(tok->encode("xyzx") == Ids{'x', 'y', 'z', 'x'});
  CHECK(tok->encode("abc") == Ids{kABC});  // in the vocabulary as a whole
}

TEST_CASE("bpe_tokenizer: a byte outside the vocabulary is dropped, or unk, or one fused unk") {
  TempDir dir;
  json j = base_tokenizer(false);
  j["model"]["vocab"].erase(byte_level("\xC3"));
  j["model"]["vocab"].erase(byte_level("\xA9"));
  // "é" is C3 A9, "©" is C2 A9.
  CHECK(load(dir, j)->encode("a\u00e9b\u00a9") == Ids{kAB, 0xC2});  // dropped, then a+b
  j["model"]["unk_token"] = "x";
  CHECK(load(dir, j)->encode("a\u00e9b\u00a9") == Ids{'a', 'x', 'x', 'b', 0xC2, 'x'});
  j["model"]["fuse_unk"] = true;
  CHECK(load(dir, j)->encode("a\u00e9b\u00a9") == Ids{'a', 'x', 'b', 0xC2, 'x'});
}

TEST_CASE("bpe_tokenizer: added tokens before the model, with their flags") {
  TempDir dir;
  json j = base_tokenizer(false);
  j["added_tokens"] = json::array({added(kS, "<s>", true, false, false, false),
                                   added(kMask, "<mask>", false, true, true, false),
                                   added(kWowTok, "wow", false, false, false, true),
                                   added(kWowTok + 1, "<s><s>", true, false, false, false)});
  auto tok = load(dir, j);
  CHECK(tok->vocab_size() == kWowTok + 2);
  CHECK(tok->encode("a<s>b") == Ids{'a', kS, 'b'});
  CHECK(tok->encode("a <s>b") == Ids{'a', ' ', kS, 'b'});      // no lstrip: the space stays
  CHECK(tok->encode("a  <mask>  b") == Ids{'a', kMask, 'b'});  // lstrip + rstrip eat spaces
  CHECK(tok->encode("<s><s><s>") == Ids{kWowTok + 1, kS});     // leftmost, then longest
  CHECK(tok->encode("wow") == Ids{kWowTok});
  CHECK(tok->encode("wow!") == Ids{kWowTok, '!'});  // punctuation is not a word
  CHECK(tok->encode("awow") == Ids{'a', kWOW});     // single_word: not inside a word
  CHECK(tok->encode("wowa") == Ids{kWOW, 'a'});
  CHECK(tok->decode({'a', kS, 'b'}) == "a<s>b");
  // special: true marks a special token (chat data trains on the one ending a turn).
  CHECK(tok->is_special(kS));
  CHECK(tok->is_special(kWowTok + 1));
  CHECK_FALSE(tok->is_special(kMask));
  CHECK_FALSE(tok->is_special('a'));
  CHECK_FALSE(tok->is_special(-1));
  CHECK_FALSE(tok->is_special(kWowTok + 2));
}

TEST_CASE("bpe_tokenizer: decode inverts encode (every ASCII byte); invalid UTF-8 is U+FFFD") {
  TempDir dir;
  auto tok = load(dir, base_tokenizer(false));
  std::string all_valid = "aab abc\t\r\n  wow 日本 😀👍🏽 e\u0301";
  CHECK(tok->decode(tok->encode(all_valid)) == all_valid);
  for (int b = 0; b < 128; ++b) {
    std::string s = "x";
    s += char(b);
    s += 'y';
    CHECK(tok->decode(tok->encode(s)) == s);
  }
  // Maximal subparts: \xE2\x82 (a cut 3-byte sequence) is one U+FFFD, \xFF one, \xED\xA0\x80 three
  // (a surrogate's lead is invalid after ED), as Python's errors="replace" gives.
  CHECK(tok->encode("a\xE2\x82z") == tok->encode("a\uFFFDz"));
  CHECK(tok->encode("a\xFF\xFEz") == tok->encode("a\uFFFD\uFFFDz"));
  CHECK(tok->encode("a\xED\xA0\x80z") == tok->encode("a\uFFFD\uFFFD\uFFFDz"));
  CHECK(tok->encode("a\xC3") == tok->encode("a\uFFFD"));
  CHECK_THROWS_AS(tok->decode({kXYZ + 1}), ft::Error);
}

TEST_CASE("bpe_tokenizer: offsets are each token's bytes of the text, through NFC") {
  using Offsets = std::vector<std::pair<size_t, size_t>>;
  TempDir dir;
  json j = base_tokenizer(false);
  j["added_tokens"] = json::array({added(kS, "<s>", true, false, false, false),
                                   added(kMask, "<mask>", false, true, true, false)});
  auto offsets_of = [&](const ft::Tokenizer& tok, const std::string& text) {
    Offsets off;
    CHECK(tok.encode_with_offsets(text, &off) == tok.encode(text));
    REQUIRE(off.size() == tok.encode(text).size());
    return off;
  };
  auto tok = load(dir, j);
  // Plain text: consecutive bytes; an added token's lstrip/rstrip spaces go with it.
  CHECK(offsets_of(*tok, "aab<s>abc") == Offsets{{0, 2}, {2, 3}, {3, 6}, {6, 7}, {7, 9}});
  CHECK(offsets_of(*tok, "a  <mask>  b") == Offsets{{0, 1}, {1, 11}, {11, 12}});
  // Invalid UTF-8: each byte of a U+FFFD stands for the whole subpart it replaced.
  CHECK(offsets_of(*tok, "a\xFF\xE2\x82z") ==
        Offsets{{0, 1}, {1, 2}, {1, 2}, {1, 2}, {2, 4}, {2, 4}, {2, 4}, {4, 5}});
  // NFC: "e" + U+0301 becomes "é" (2 bytes, 2 tokens here), each standing for the 3 original
  // bytes of the segment; unchanged text around it maps byte for byte.
  j["normalizer"] = {{"type", "NFC"}};
  tok = load(dir, j);
  CHECK(tok->encode("Cafe\u0301!") == tok->encode("Caf\u00e9!"));
  CHECK(offsets_of(*tok, "Cafe\u0301!") == Offsets{{0, 1}, {1, 2}, {2, 3}, {3, 6}, {3, 6}, {6, 7}});
  CHECK(offsets_of(*tok, "x e\u0301\u0301 <s>") ==
        Offsets{{0, 1}, {1, 2}, {2, 7}, {2, 7}, {2, 7}, {2, 7}, {7, 8}, {8, 11}});
  // ByteLevel's added leading space stands for nothing: an empty range where the piece starts.
  j["normalizer"] = nullptr;
  j["pre_tokenizer"]["add_prefix_space"] = true;
  tok = load(dir, j);
  CHECK(tok->encode("ab") == Ids{' ', kAB});
  CHECK(offsets_of(*tok, "ab") == Offsets{{0, 0}, {0, 2}});
}

TEST_CASE("bpe_tokenizer: what ft does not read is refused by key") {
  TempDir dir;
  auto refused = [&](const json& j, const std::string& text) {
    CAPTURE(text);
    try {
      load(dir, j);
      FAIL("loaded");
    } catch (const ft::Error& e) {
      CHECK(std::string(e.what()).find(text) != std::string::npos);
      CHECK(std::string(e.what()).find(dir.file("tokenizer.json")) != std::string::npos);
    }
  };
  json j = base_tokenizer(false);
  j["model"]["type"] = "Unigram";
  refused(j, "model.type: \"Unigram\" is not supported");
  j = base_tokenizer(false);
  j["model"]["merges"][1] = json::array({"a", "qq"});
  refused(j, "model.merges[1]: \"qq\" is not in model.vocab");
  j = base_tokenizer(true);
  j["model"]["merges"][2] = "ab";
  refused(j, "model.merges[2]: \"ab\" is not two tokens");
  j = base_tokenizer(false);
  j["normalizer"] = {{"type", "NFKC"}};
  refused(j, "normalizer.type: \"NFKC\" is not supported");
  j = base_tokenizer(false);
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  refused(j, "pre_tokenizer.type: \"Metaspace\" is not supported");
  j = base_tokenizer(false);
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(?<!x"}}}, {"behavior", "Isolated"}}}}};
  refused(j, "pre_tokenizer.pretokenizers[0].pattern.Regex: PCRE2 cannot compile");
  j = base_tokenizer(false);
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  refused(j, "post_processor.type: \"RobertaProcessing\" is not supported");
  j = base_tokenizer(false);
  j["truncation"] = {{"max_length", 8}};
  refused(j, "truncation: ft does not truncate");
  j = base_tokenizer(false);
  j["model"]["byte_fallback"] = true;
  refused(j, "model.byte_fallback: true is not supported");
}

TEST_CASE("bpe_tokenizer: BOS and EOS from the post-processor's single template") {
  TempDir dir;
  json j = base_tokenizer(false);
  j["added_tokens"] = json::array({added(kS, "<s>", true, false, false, false),
                                   added(kS + 1, "</s>", true, false, false, false)});
  auto special = [](const std::string& t, int32_t id) {
    return json{{"id", t}, {"ids", {id}}, {"tokens", {t}}};
  };
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<s>", special("<s>", kS)}, {"</s>", special("</s>", kS + 1)}}}};
  auto tok = load(dir, j);
  CHECK(tok->bos_id() == kS);
  CHECK(tok->eos_id() == kS + 1);
  CHECK(tok->encode("ab") == Ids{kAB});  // encode itself adds neither (tokenize.h frames)
}

TEST_CASE("tokenizer paths: a folder resolves to its tokenizer file") {
  TempDir dir;
  std::ofstream(dir.file("tokenizer.json")) << base_tokenizer(false).dump();
  CHECK(ft::resolve_tokenizer_file(dir.path) == dir.file("tokenizer.json"));
  auto tok = ft::load_tokenizer(dir.path);
  CHECK(tok->path() == dir.file("tokenizer.json"));
  CHECK(tok->sha256().size() == 64);
  TempDir empty;
  CHECK_THROWS_WITH_AS(ft::resolve_tokenizer_file(empty.path),
                       doctest::Contains("a folder without tokenizer.model or tokenizer.json"),
                       ft::UsageError);
}
