// Byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Llama 3, Qwen2 and their kin).
//
// The pipeline, in the order the `tokenizers` library (huggingface/tokenizers, tokenizer/mod.rs
// and added_vocabulary.rs) runs it:
//   0. invalid UTF-8 in the input: each maximal invalid subpart becomes U+FFFD (what Python's
//      bytes.decode("utf-8", errors="replace") gives; `tokenizers` itself takes only str).
//   1. added tokens with normalized=false are cut out of the raw text (leftmost, then longest;
//      single_word, lstrip, rstrip as added_vocabulary.rs applies them);
//   2. the normalizer (none, or NFC) runs on the pieces between them, and added tokens with
//      normalized=true are cut out of those;
//   3. the pre-tokenizer splits each remaining piece: the Split regexes in file order (behavior
//      Isolated: every match and every gap is a piece), then ByteLevel (a leading space when
//      add_prefix_space and the piece lacks one; with use_regex, the GPT-2 pattern);
//   4. BPE on the bytes of each piece: the whole piece when ignore_merges and it is in the
//      vocabulary, else one symbol per byte merged pairwise by rank, lowest rank first and
//      leftmost first among equal ranks (bpe/model.rs's heap order).
// Byte-level BPE writes each byte as a printable code point (GPT-2's bytes_to_unicode, below);
// the vocabulary is translated back to raw bytes once at load, so encoding never maps bytes.
// Regexes are PCRE2 with UTF and UCP (\p{..}, \d, \w by Unicode properties; \s rewritten as
// Unicode White_Space, which is Oniguruma's), JIT-compiled.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"
#include "core/utf8.h"
#include "data/sha256.h"
#include "data/tokenizer.h"

namespace ft {
namespace {

using json = nlohmann::json;

// The pattern ByteLevel applies itself when use_regex is true (GPT-2's encoder.py).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// take U+0100.. in byte order. Returns the code point of each byte.
std::array<uint32_t, 256> byte_to_code_point() {
  std::array<uint32_t, 256> m{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    m[b] = printable ? b : next++;
  }
  return m;
}

// Decodes one UTF-8 code point at s[i] (s valid UTF-8); advances i.
uint32_t next_code_point(std::string_view s, size_t* i) {
  const uint8_t c = uint8_t(s[*i]);
  int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(s[*i + k]) & 0x3F);
  *i += len;
  return cp;
}

// How positions in a buffer the encoder works on map back to the caller's text
// (encode_with_offsets). A buffer is the text itself (or a copy with invalid UTF-8 replaced),
// a piece after NFC, or a piece with ByteLevel's leading space; views into a buffer share its
// Align. Runs map stretches of the buffer to the parent's: byte for byte where unchanged, as a
// whole where a normalization changed them.
struct Align {
  struct Run {
    size_t begin, end;  // in this buffer
    size_t from, to;    // in the parent
    bool whole;         // changed: any byte of it stands for all of [from, to)
  };
  const char* base = nullptr;
  const Align* parent = nullptr;  // null: positions are the caller's text
  std::vector<Run> runs;          // empty: byte i is the parent's byte shift + i
  size_t shift = 0;
  bool prefix = false;  // base is " " + the parent's bytes from shift: byte 0 stands for nothing

  // The parent position where a range of this buffer starting at a begins, and where one
  // ending at b ends.
  size_t start_of(size_t a) const {
    if (runs.empty()) return prefix ? (a == 0 ? shift : shift + a - 1) : shift + a;
    auto it = std::upper_bound(runs.begin(), runs.end(), a,
                               [](size_t x, const Run& r) { return x < r.begin; });
    const Run& r = *(it == runs.begin() ? it : it - 1);
    if (a >= r.end) return r.to;
    return r.whole ? r.from : r.from + (a - r.begin);
  }
  size_t end_of(size_t b) const {
    if (runs.empty()) return prefix ? (b == 0 ? shift : shift + b - 1) : shift + b;
    if (b == 0) return runs.front().from;
    auto it = std::upper_bound(runs.begin(), runs.end(), b - 1,
                               [](size_t x, const Run& r) { return x < r.begin; });
    const Run& r = *(it == runs.begin() ? it : it - 1);
    return r.whole ? r.to : r.from + (b - r.begin);
  }
  std::pair<size_t, size_t> to_text(size_t a, size_t b) const {
    size_t pa = start_of(a), pb = a == b ? pa : std::max(pa, end_of(b));
    return parent ? parent->to_text(pa, pb) : std::make_pair(pa, pb);
  }
};

// Where encode puts its ids (and, for encode_with_offsets, their offsets).
struct Sink {
  std::vector<int32_t>* ids;
  std::vector<std::pair<size_t, size_t>>* offsets;  // null: not wanted
  // Token id made from the n bytes at p, in al's buffer.
  void add(int32_t id, const Align& al, const char* p, size_t n) const {
    ids->push_back(id);
    if (offsets) {
      const size_t a = size_t(p - al.base);
      offsets->push_back(al.to_text(a, a + n));
    }
  }
};

// NFC of valid UTF-8 (ICU); the input itself when it is already in NFC.
std::string nfc(std::string_view s) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  const icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  if (U_SUCCESS(err) && n->isNormalized(u, err) && U_SUCCESS(err)) return std::string(s);
  err = U_ZERO_ERROR;
  const icu::UnicodeString out = n->normalize(u, err);
  if (U_FAILURE(err)) FT_FAIL("NFC normalization failed (", u_errorName(err), ")");
  std::string text;
  out.toUTF8String(text);
  return text;
}

// NFC of valid UTF-8 `s`, normalized segment by segment (a segment starts at each code point
// with a normalization boundary before it, so each normalizes alone and together they give
// nfc(s)), with the runs that map the result back to s (s's byte i is the parent's at + i).
std::string nfc_with_runs(std::string_view s, size_t at, std::vector<Align::Run>* runs) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  if (U_FAILURE(err)) FT_FAIL("NFC normalization failed (", u_errorName(err), ")");
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    bool ascii = uint8_t(s[i]) < 0x80;
    next_code_point(s, &j);
    while (j < s.size()) {
      size_t k = j;
      const uint32_t c = next_code_point(s, &k);
      if (n->hasBoundaryBefore(UChar32(c))) break;
      ascii = false;
      j = k;
    }
    const std::string_view seg = s.substr(i, j - i);
    const std::string norm = ascii ? std::string(seg) : nfc(seg);  // ASCII alone is NFC
    const bool changed = norm != seg;
    if (!changed && !runs->empty() && !runs->back().whole && runs->back().end == out.size())
      runs->back().end += norm.size(), runs->back().to += norm.size();
    else
      runs->push_back({out.size(), out.size() + norm.size(), at + i, at + j, changed});
    out += norm;
    i = j;
  }
  return out;
}

// Unicode White_Space (what Rust's \s matches; added_vocabulary.rs strips it for lstrip/rstrip).
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Start of the UTF-8 character that ends at s[end).
size_t prev_char_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

// Unicode White_Space as a class body: what \s means in Oniguruma, the engine `tokenizers` runs
// these patterns with. PCRE2's \s (UCP) also takes U+180E (a space before Unicode 6.3), which
// splits "\u180E's" differently; so \s and \S are spelled out (found by comparing with
// `tokenizers` on random text).
constexpr const char* kWhiteSpaceClass =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F})"
    R"(\x{3000})";

// `pattern` with \s and \S replaced by kWhiteSpaceClass (\S outside a class only; inside one it
// has no class-body form, and no tokenizer.json seen uses it).
std::string spell_out_white_space(const std::string& pattern, const std::string& where) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[++i];
      if (n == 'S' && in_class)
        FT_FAIL(where, ": \\S inside a character class is not supported: ", pattern);
      if (n == 's' || n == 'S') {
        if (!in_class) out += n == 's' ? "[" : "[^";
        out += kWhiteSpaceClass;
        if (!in_class) out += ']';
      } else {
        out += {c, n};
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// A compiled PCRE2 pattern, shared read-only by all threads; each thread matches with its own
// match data and JIT stack (MatchState).
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE at = 0;
    uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    const std::string text = literal ? pattern : spell_out_white_space(pattern, where);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), flags, &err, &at,
                          nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      FT_FAIL(where, ": PCRE2 cannot compile the pattern at offset ", at, " (",
              reinterpret_cast<char*>(msg), "): ", pattern);
    }
    // Where the JIT is unavailable pcre2_match interprets the pattern: slower, same matches.
    (void)pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The first match in s at or after `from`: true and [*start, *end), or false. `anchored`
  // matches only at `from`.
  bool find(std::string_view s, size_t from, size_t* start, size_t* end,
            bool anchored = false) const {
    MatchState& st = state();
    const uint32_t opts = PCRE2_NO_UTF_CHECK | (anchored ? PCRE2_ANCHORED : 0);
    auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    int rc = pcre2_match(code_, subject, s.size(), from, opts, st.data, st.context);
    // The JIT's stack is bounded; the interpreter keeps its backtracking frames on the heap.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_, subject, s.size(), from, opts | PCRE2_NO_JIT, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      FT_FAIL("PCRE2 match failed: ", reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    *start = ov[0];
    *end = ov[1];
    return true;
  }

 private:
  struct MatchState {
    pcre2_match_data* data = pcre2_match_data_create(8, nullptr);
    pcre2_match_context* context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack* stack = pcre2_jit_stack_create(64 << 10, 4 << 20, nullptr);
    MatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
    ~MatchState() {
      pcre2_jit_stack_free(stack);
      pcre2_match_context_free(context);
      pcre2_match_data_free(data);
    }
  };
  static MatchState& state() {
    thread_local MatchState s;
    return s;
  }

  pcre2_code* code_ = nullptr;
};

struct AddedToken {
  std::string content;
  std::string match;  // what is searched for: content, NFC-normalized when normalized and NFC
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Added tokens of one matching pass, indexed by first byte, longest first (so the first that
// matches at a position is the longest there).
struct AddedTokenSet {
  std::array<std::vector<const AddedToken*>, 256> by_first_byte;
  bool empty = true;
  void add(const AddedToken* t) {
    by_first_byte[uint8_t(t->match[0])].push_back(t);
    empty = false;
  }
  void sort() {
    for (auto& v : by_first_byte)
      std::stable_sort(v.begin(), v.end(), [](const AddedToken* a, const AddedToken* b) {
        return a->match.size() > b->match.size();
      });
  }
};

// A readable path to a JSON value for errors: tokenizer.json: pre_tokenizer.pretokenizers[0]...
std::string at(const std::string& file, const std::string& key) { return file + ": " + key; }

const json& need(const json& j, const char* name, const std::string& file, const std::string& key) {
  auto it = j.find(name);
  if (it == j.end()) FT_FAIL(at(file, key + "." + name), ": missing");
  return *it;
}

std::string type_of(const json& j, const std::string& file, const std::string& key) {
  if (!j.is_object()) FT_FAIL(at(file, key), ": expected an object, got ", j.type_name());
  const json& t = need(j, "type", file, key);
  if (!t.is_string()) FT_FAIL(at(file, key + ".type"), ": expected a string");
  return t.get<std::string>();
}

bool flag(const json& j, const char* name, bool dflt, const std::string& file,
          const std::string& key) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean())
    FT_FAIL(at(file, key + "." + name), ": expected true or false, got ", it->type_name());
  return it->get<bool>();
}

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const std::string& file);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_with_offsets(
      std::string_view text, std::vector<std::pair<size_t, size_t>>* offsets) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < vocab_size_ && added_index_[id] >= 0 && added_[added_index_[id]].special;
  }

 private:
  void load_model(const json& m);
  void load_added_tokens(const json& a);
  void load_normalizer(const json& n);
  void load_pre_tokenizer(const json& p, const std::string& key);
  void load_post_processor(const json& p, const std::string& key);
  void load_decoder(const json& d, const std::string& key);

  std::vector<int32_t> encode_impl(std::string_view text,
                                   std::vector<std::pair<size_t, size_t>>* offsets) const;
  // Cuts the added tokens of `set` out of `s`: calls gap(piece) for the text between them and
  // token(id, begin, end) for each (the bytes of s it took), in order.
  template <class Gap, class Token>
  void split_added(std::string_view s, const AddedTokenSet& set, Gap&& gap, Token&& token) const;
  bool word_char_before(std::string_view s, size_t pos) const;
  bool word_char_at(std::string_view s, size_t pos) const;
  // Steps 2-4 on a piece between added tokens of the first pass.
  void encode_gap(std::string_view piece, const Align& al, const Sink& out) const;
  // Step 3 from regex `stage` on, then step 4.
  // (pieces are views into al's buffer)
  void pre_tokenize(std::string_view piece, size_t stage, const Align& al, const Sink& out) const;
  void pre_tokenize_spaced(std::string_view piece, size_t stage, const Align& al,
                           const Sink& out) const;
  void bpe(std::string_view word, const Align& al, const Sink& out) const;

  // The model. Tokens are keyed by their raw bytes (the byte-level text translated back).
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_bytes_;  // (vocab_size_) raw bytes of each model token
  std::array<int32_t, 256> byte_id_;   // the token of each single byte, -1 when none
  struct Merge {
    int32_t rank, id;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  int32_t unk_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  std::vector<AddedToken> added_;     // from added_tokens
  std::vector<int32_t> added_index_;  // (vocab_size_) index into added_, or -1
  AddedTokenSet raw_set_, normalized_set_;
  std::unique_ptr<Regex> word_char_;  // \w as Rust's regex crate defines it (single_word)

  bool nfc_ = false;
  std::vector<std::unique_ptr<Regex>> splits_;  // Split pre-tokenizers, then ByteLevel's own
  size_t byte_level_stage_ = 0;  // splits_ before ByteLevel (its own regex, if any, is next)
  bool prefix_space_ = false;

  int32_t bos_ = -1, eos_ = -1;
  int64_t vocab_size_ = 0;
  std::string file_;
};

BpeTokenizer::BpeTokenizer(const std::string& file) : file_(file) {
  path_ = file;
  const std::string text = read_bounded_file(
      file, kMaxTokenizerBytes, "tokenizer",
      "give a Hugging Face tokenizer.json, a SentencePiece .model or a Hugging Face folder");
  sha256_ = sha256_hex(text.data(), text.size());
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw UsageError(file + ": not valid JSON (" + json_error_words(e) + ")");
  }
  if (!j.is_object()) FT_FAIL(file, ": expected a JSON object (a Hugging Face tokenizer.json)");
  if (!j.contains("model")) {
    if (j.contains("config") && j.contains("vocab"))
      FT_FAIL(file,
              ": looks like Mistral's tekken.json, which ft does not read; give a "
              "tokenizer.json (Hugging Face tokenizers format) or a SentencePiece .model");
    FT_FAIL(at(file, "model"), ": missing; not a Hugging Face tokenizer.json");
  }
  for (const char* k : {"truncation", "padding"}) {
    auto it = j.find(k);
    if (it != j.end() && !it->is_null())
      FT_FAIL(at(file, k), ": ft does not truncate or pad while tokenizing; set it to null");
  }
  load_model(j["model"]);
  load_normalizer(j.value("normalizer", json()));
  load_added_tokens(j.value("added_tokens", json::array()));
  load_pre_tokenizer(j.value("pre_tokenizer", json()), "pre_tokenizer");
  load_post_processor(j.value("post_processor", json()), "post_processor");
  load_decoder(j.value("decoder", json()), "decoder");
}

void BpeTokenizer::load_model(const json& m) {
  const std::string type = type_of(m, file_, "model");
  if (type != "BPE")
    FT_FAIL(at(file_, "model.type"), ": \"", type,
            "\" is not supported; ft reads byte-level BPE tokenizer.json files (model.type "
            "\"BPE\") and SentencePiece .model files");
  if (flag(m, "byte_fallback", false, file_, "model"))
    FT_FAIL(at(file_, "model.byte_fallback"),
            ": true is not supported (a SentencePiece-style BPE); give the model's "
            "tokenizer.model instead");
  if (m.contains("dropout") && !m["dropout"].is_null())
    FT_FAIL(at(file_, "model.dropout"), ": BPE dropout is not supported; set it to null");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = m.find(k);
    if (it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      FT_FAIL(at(file_, std::string("model.") + k), ": not supported; only null");
  }
  ignore_merges_ = flag(m, "ignore_merges", false, file_, "model");

  const auto to_cp = byte_to_code_point();
  std::unordered_map<uint32_t, uint8_t> from_cp;
  for (int b = 0; b < 256; ++b) from_cp[to_cp[b]] = uint8_t(b);
  // Raw bytes of a byte-level token; false when it holds a character outside the byte map
  // (such a token cannot come out of BPE; decode gives its text as is).
  auto raw_bytes = [&](const std::string& tok, std::string* out) {
    out->clear();
    if (!is_valid_utf8(tok)) return false;
    for (size_t i = 0; i < tok.size();) {
      auto it = from_cp.find(next_code_point(tok, &i));
      if (it == from_cp.end()) return false;
      out->push_back(char(it->second));
    }
    return true;
  };

  const json& vocab = need(m, "vocab", file_, "model");
  if (!vocab.is_object()) FT_FAIL(at(file_, "model.vocab"), ": expected an object");
  std::vector<std::pair<int32_t, std::string>> entries;
  int64_t max_id = -1;
  std::unordered_map<std::string, int32_t> by_text;  // byte-level text -> id, for merges
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX)
      FT_FAIL(at(file_, "model.vocab[\"" + it.key() + "\"]"), ": expected a token id");
    const int32_t id = it.value().get<int32_t>();
    max_id = std::max<int64_t>(max_id, id);
    by_text[it.key()] = id;
    entries.emplace_back(id, it.key());
  }
  vocab_size_ = max_id + 1;
  id_bytes_.assign(vocab_size_, std::string());
  byte_id_.fill(-1);
  std::string raw;
  for (const auto& [id, text] : entries) {
    if (raw_bytes(text, &raw)) {
      vocab_[raw] = id;
      if (raw.size() == 1) byte_id_[uint8_t(raw[0])] = id;
      id_bytes_[id] = raw;
    } else {
      id_bytes_[id] = text;
    }
  }
  auto unk = m.find("unk_token");
  if (unk != m.end() && unk->is_string()) {
    auto it = by_text.find(unk->get<std::string>());
    if (it == by_text.end())
      FT_FAIL(at(file_, "model.unk_token"), ": \"", unk->get<std::string>(),
              "\" is not in model.vocab");
    unk_ = it->second;
    fuse_unk_ = flag(m, "fuse_unk", false, file_, "model");
  }

  const json& merges = need(m, "merges", file_, "model");
  if (!merges.is_array()) FT_FAIL(at(file_, "model.merges"), ": expected an array");
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    const std::string key = "model.merges[" + std::to_string(r) + "]";
    std::string a, b;
    if (e.is_string()) {  // "a b"
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        FT_FAIL(at(file_, key), ": \"", s, "\" is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      FT_FAIL(at(file_, key), ": expected \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = by_text.find(a), ib = by_text.find(b), im = by_text.find(a + b);
    for (auto [it, name] : {std::pair{ia, &a}, std::pair{ib, &b}})
      if (it == by_text.end()) FT_FAIL(at(file_, key), ": \"", *name, "\" is not in model.vocab");
    if (im == by_text.end()) FT_FAIL(at(file_, key), ": \"", a + b, "\" is not in model.vocab");
    // A later duplicate replaces an earlier one, as bpe/model.rs builds its map.
    merges_[uint64_t(uint32_t(ia->second)) << 32 | uint32_t(ib->second)] =
        Merge{int32_t(r), im->second};
  }
}

void BpeTokenizer::load_added_tokens(const json& a) {
  if (!a.is_array()) FT_FAIL(at(file_, "added_tokens"), ": expected an array");
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string key = "added_tokens[" + std::to_string(i) + "]";
    const json& t = a[i];
    if (!t.is_object()) FT_FAIL(at(file_, key), ": expected an object");
    AddedToken tok;
    const json& id = need(t, "id", file_, key);
    const json& content = need(t, "content", file_, key);
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      FT_FAIL(at(file_, key + ".id"), ": expected a token id");
    if (!content.is_string()) FT_FAIL(at(file_, key + ".content"), ": expected a string");
    tok.id = id.get<int32_t>();
    tok.content = content.get<std::string>();
    tok.special = flag(t, "special", false, file_, key);
    tok.single_word = flag(t, "single_word", false, file_, key);
    tok.lstrip = flag(t, "lstrip", false, file_, key);
    tok.rstrip = flag(t, "rstrip", false, file_, key);
    tok.normalized = flag(t, "normalized", !tok.special, file_, key);
    if (tok.content.empty()) continue;  // `tokenizers` ignores empty ones too
    added_.push_back(tok);
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t(tok.id) + 1);
  }
  id_bytes_.resize(vocab_size_);
  added_index_.assign(vocab_size_, -1);
  for (size_t i = 0; i < added_.size(); ++i) {
    // `tokenizers` normalizes a normalized token's content before matching it
    // (added_vocabulary.rs refresh_added_tokens).
    added_[i].match = added_[i].normalized && nfc_ ? nfc(added_[i].content) : added_[i].content;
    added_index_[added_[i].id] = int32_t(i);
    (added_[i].normalized ? normalized_set_ : raw_set_).add(&added_[i]);
    if (added_[i].single_word && !word_char_)
      // Rust's regex \w: Alphabetic, M, Nd, Pc and Join_Control.
      word_char_ = std::make_unique<Regex>(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])",
                                           false, at(file_, "added_tokens"));
  }
  raw_set_.sort();
  normalized_set_.sort();
}

void BpeTokenizer::load_normalizer(const json& n) {
  if (n.is_null()) return;
  const std::string type = type_of(n, file_, "normalizer");
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
      n["normalizers"].empty())
    return;
  if (type == "NFC") {
    nfc_ = true;
    return;
  }
  FT_FAIL(at(file_, "normalizer.type"), ": \"", type,
          "\" is not supported; ft applies no normalizer or NFC");
}

void BpeTokenizer::load_pre_tokenizer(const json& p, const std::string& key) {
  if (p.is_null())
    FT_FAIL(at(file_, key), ": null; ft reads byte-level BPE, which needs ByteLevel");
  const std::string type = type_of(p, file_, key);
  std::vector<std::pair<const json*, std::string>> steps;
  if (type == "Sequence") {
    const json& list = need(p, "pretokenizers", file_, key);
    if (!list.is_array()) FT_FAIL(at(file_, key + ".pretokenizers"), ": expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      steps.emplace_back(&list[i], key + ".pretokenizers[" + std::to_string(i) + "]");
  } else {
    steps.emplace_back(&p, key);
  }
  bool byte_level = false;
  for (const auto& [step, skey] : steps) {
    const std::string t = type_of(*step, file_, skey);
    if (byte_level)
      FT_FAIL(at(file_, skey), ": \"", t,
              "\" after ByteLevel is not supported (ByteLevel must come last)");
    if (t == "Split") {
      const json& pat = need(*step, "pattern", file_, skey);
      const std::string behavior = step->value("behavior", std::string());
      if (behavior != "Isolated")
        FT_FAIL(at(file_, skey + ".behavior"), ": \"", behavior,
                "\" is not supported; only \"Isolated\"");
      if (flag(*step, "invert", false, file_, skey))
        FT_FAIL(at(file_, skey + ".invert"), ": true is not supported");
      if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string())
        splits_.push_back(std::make_unique<Regex>(pat["Regex"].get<std::string>(), false,
                                                  at(file_, skey + ".pattern.Regex")));
      else if (pat.is_object() && pat.contains("String") && pat["String"].is_string())
        splits_.push_back(std::make_unique<Regex>(pat["String"].get<std::string>(), true,
                                                  at(file_, skey + ".pattern.String")));
      else
        FT_FAIL(at(file_, skey + ".pattern"), ": expected {\"Regex\": ...} or {\"String\": ...}");
    } else if (t == "ByteLevel") {
      byte_level = true;
      byte_level_stage_ = splits_.size();
      prefix_space_ = flag(*step, "add_prefix_space", true, file_, skey);
      if (flag(*step, "use_regex", true, file_, skey))
        splits_.push_back(
            std::make_unique<Regex>(kGpt2Pattern, false, at(file_, skey + " (GPT-2 pattern)")));
    } else {
      FT_FAIL(at(file_, skey + ".type"), ": \"", t,
              "\" is not supported; ft reads Split (behavior Isolated) followed by ByteLevel");
    }
  }
  if (!byte_level)
    FT_FAIL(at(file_, key), ": no ByteLevel pre-tokenizer; ft reads byte-level BPE only");
}

void BpeTokenizer::load_post_processor(const json& p, const std::string& key) {
  if (p.is_null()) return;
  const std::string type = type_of(p, file_, key);
  if (type == "ByteLevel") return;  // offsets only; ids unchanged
  if (type == "Sequence") {
    const json& list = need(p, "processors", file_, key);
    if (!list.is_array()) FT_FAIL(at(file_, key + ".processors"), ": expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      load_post_processor(list[i], key + ".processors[" + std::to_string(i) + "]");
    return;
  }
  if (type != "TemplateProcessing")
    FT_FAIL(at(file_, key + ".type"), ": \"", type,
            "\" is not supported; ft reads ByteLevel and TemplateProcessing");
  // The single-sequence template: special tokens before $A frame a document as BOS, after it
  // as EOS (DESIGN.md §6). The pair template is for sentence pairs, which ft never encodes.
  const json& single = need(p, "single", file_, key);
  const json& specials = p.value("special_tokens", json::object());
  if (!single.is_array()) FT_FAIL(at(file_, key + ".single"), ": expected an array");
  bool seen_a = false;
  std::vector<int32_t> before, after;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string ikey = key + ".single[" + std::to_string(i) + "]";
    const json& item = single[i];
    if (item.contains("Sequence")) {
      seen_a = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id"))
      FT_FAIL(at(file_, ikey), ": expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    auto sp = specials.find(name);
    if (sp == specials.end() || !sp->contains("ids") || !(*sp)["ids"].is_array())
      FT_FAIL(at(file_, key + ".special_tokens"), ": no ids for \"", name, "\"");
    for (const json& id : (*sp)["ids"]) (seen_a ? after : before).push_back(id.get<int32_t>());
  }
  if (before.size() > 1 || after.size() > 1)
    FT_FAIL(at(file_, key + ".single"),
            ": more than one token before or after $A is not supported (ft frames a document "
            "with at most one BOS and one EOS)");
  if (!before.empty()) bos_ = before[0];
  if (!after.empty()) eos_ = after[0];
  for (int32_t id : {bos_, eos_})
    if (id >= vocab_size_)
      FT_FAIL(at(file_, key + ".special_tokens"), ": id ", id, " is outside the vocabulary");
}

void BpeTokenizer::load_decoder(const json& d, const std::string& key) {
  if (d.is_null()) return;
  const std::string type = type_of(d, file_, key);
  if (type != "ByteLevel")
    FT_FAIL(at(file_, key + ".type"), ": \"", type, "\" is not supported; ft decodes ByteLevel");
}

bool BpeTokenizer::word_char_before(std::string_view s, size_t pos) const {
  if (pos == 0) return false;
  size_t a, b;
  return word_char_->find(s, prev_char_start(s, pos), &a, &b, true);
}

bool BpeTokenizer::word_char_at(std::string_view s, size_t pos) const {
  if (pos >= s.size()) return false;
  size_t a, b;
  return word_char_->find(s, pos, &a, &b, true);
}

template <class Gap, class Token>
void BpeTokenizer::split_added(std::string_view s, const AddedTokenSet& set, Gap&& gap,
                               Token&& token) const {
  if (set.empty) {
    gap(s);
    return;
  }
  size_t done = 0;  // end of the last token taken (its stripped spaces included)
  size_t pos = 0;   // where the search for the next match starts
  while (pos < s.size()) {
    // The leftmost position where a token matches, and the longest token there.
    const AddedToken* hit = nullptr;
    size_t start = pos;
    for (; start < s.size(); ++start) {
      for (const AddedToken* t : set.by_first_byte[uint8_t(s[start])])
        if (s.compare(start, t->match.size(), t->match) == 0) {
          hit = t;
          break;
        }
      if (hit) break;
    }
    if (!hit) break;
    size_t stop = start + hit->match.size();
    pos = stop;  // a discarded match is consumed too, as aho-corasick's find_iter does
    if (hit->single_word && (word_char_before(s, start) || word_char_at(s, stop))) continue;
    if (hit->lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t p = prev_char_start(s, b), q = p;
        if (!is_white_space(next_code_point(s, &q))) break;
        b = p;
      }
      start = std::max(b, done);
    }
    if (hit->rstrip) {
      while (stop < s.size()) {
        size_t q = stop;
        if (!is_white_space(next_code_point(s, &q))) break;
        stop = q;
      }
      pos = stop;
    }
    if (done < start) gap(s.substr(done, start - done));
    token(hit->id, start, stop);
    done = stop;
  }
  if (done < s.size()) gap(s.substr(done));
}

void BpeTokenizer::encode_gap(std::string_view piece, const Align& al, const Sink& out) const {
  if (nfc_) {
    Align nal;
    nal.parent = &al;
    const std::string normalized =
        out.offsets ? nfc_with_runs(piece, size_t(piece.data() - al.base), &nal.runs) : nfc(piece);
    nal.base = normalized.data();
    split_added(
        normalized, normalized_set_, [&](std::string_view p) { pre_tokenize(p, 0, nal, out); },
        [&](int32_t id, size_t b, size_t e) { out.add(id, nal, normalized.data() + b, e - b); });
    return;
  }
  split_added(
      piece, normalized_set_, [&](std::string_view p) { pre_tokenize(p, 0, al, out); },
      [&](int32_t id, size_t b, size_t e) { out.add(id, al, piece.data() + b, e - b); });
}

void BpeTokenizer::pre_tokenize(std::string_view piece, size_t stage, const Align& al,
                                const Sink& out) const {
  // ByteLevel's leading space goes on each piece the Split stages made, before ByteLevel's own
  // regex (byte_level.rs prepends it per piece).
  if (stage == byte_level_stage_ && prefix_space_ && (piece.empty() || piece[0] != ' ')) {
    std::string spaced = " ";
    spaced += piece;
    Align sal;
    sal.base = spaced.data();
    sal.parent = &al;
    sal.shift = size_t(piece.data() - al.base);
    sal.prefix = true;
    pre_tokenize_spaced(spaced, stage, sal, out);
    return;
  }
  pre_tokenize_spaced(piece, stage, al, out);
}

void BpeTokenizer::pre_tokenize_spaced(std::string_view piece, size_t stage, const Align& al,
                                       const Sink& out) const {
  if (stage == splits_.size()) {
    bpe(piece, al, out);
    return;
  }
  const Regex& re = *splits_[stage];
  size_t last = 0, from = 0, s, e;
  while (from <= piece.size() && re.find(piece, from, &s, &e)) {
    if (e == s) {  // an empty match splits nothing; step over one character
      if (s >= piece.size()) break;
      from = s;
      next_code_point(piece, &from);
      continue;
    }
    if (s > last) pre_tokenize(piece.substr(last, s - last), stage + 1, al, out);
    pre_tokenize(piece.substr(s, e - s), stage + 1, al, out);
    last = from = e;
  }
  if (last < piece.size()) pre_tokenize(piece.substr(last), stage + 1, al, out);
}

void BpeTokenizer::bpe(std::string_view word, const Align& al, const Sink& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out.add(it->second, al, word.data(), word.size());
      return;
    }
  }
  // Symbols in a linked list over the bytes (each with the bytes [begin, end) of the word it
  // holds); a heap of candidate merges ordered by rank, then position; a popped merge whose
  // pair has changed since it was pushed is skipped.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t begin, end;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  bool last_unknown = false;
  for (size_t i = 0; i < word.size(); ++i) {
    int32_t id = byte_id_[uint8_t(word[i])];
    const bool unknown = id < 0;
    if (unknown) {
      if (unk_ < 0) continue;  // no unk token: the byte is dropped, as bpe/model.rs does
      id = unk_;
      // fuse_unk: a run of unknown bytes is one unk (bpe/model.rs merge_word).
      if (fuse_unk_ && last_unknown) {
        sym.back().end = uint32_t(i + 1);
        continue;
      }
    }
    last_unknown = unknown;
    const int32_t n = int32_t(sym.size());
    sym.push_back({id, n - 1, -1, uint32_t(i), uint32_t(i + 1)});
    if (n > 0) sym[n - 1].next = n;
  }
  struct Candidate {
    int32_t rank, pos, id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    auto it = merges_.find(uint64_t(uint32_t(sym[pos].id)) << 32 | uint32_t(sym[sym[pos].next].id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.id});
  };
  for (int32_t i = 0; i + 1 < int32_t(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    if (left.id < 0 || left.next < 0) continue;
    auto it = merges_.find(uint64_t(uint32_t(left.id)) << 32 | uint32_t(sym[left.next].id));
    if (it == merges_.end() || it->second.id != c.id) continue;
    Symbol& right = sym[left.next];
    left.id = c.id;
    left.end = right.end;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.pos;
    right.id = -1;  // dead
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next)
    out.add(sym[i].id, al, word.data() + sym[i].begin, sym[i].end - sym[i].begin);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  return encode_impl(text, nullptr);
}

std::vector<int32_t> BpeTokenizer::encode_with_offsets(
    std::string_view text, std::vector<std::pair<size_t, size_t>>* offsets) const {
  offsets->clear();
  return encode_impl(text, offsets);
}

std::vector<int32_t> BpeTokenizer::encode_impl(
    std::string_view text, std::vector<std::pair<size_t, size_t>>* offsets) const {
  Align root;  // the text, or a copy with its invalid UTF-8 replaced (each subpart a run)
  std::string fixed;
  if (!is_valid_utf8(text)) {
    std::vector<std::pair<size_t, size_t>> replaced;
    fixed = replace_invalid_utf8(text, &replaced);
    size_t in = 0, at = 0;  // next byte of text, of fixed
    auto same = [&](size_t n) {
      if (n) root.runs.push_back({at, at + n, in, in + n, false});
      at += n, in += n;
    };
    for (const auto& [b, e] : replaced) {
      same(b - in);
      root.runs.push_back({at, at + 3, b, e, true});  // U+FFFD: 3 bytes
      at += 3, in = e;
    }
    same(text.size() - in);
    text = fixed;
  }
  root.base = text.data();
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  const Sink out{&ids, offsets};
  split_added(
      text, raw_set_, [&](std::string_view gap) { encode_gap(gap, root, out); },
      [&](int32_t id, size_t b, size_t e) { out.add(id, root, text.data() + b, e - b); });
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_)
      FT_FAIL(file_, ": token id ", id, " is outside the vocabulary");
    if (added_index_[id] >= 0)
      out += added_[added_index_[id]].content;
    else
      out += id_bytes_[id];
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& file) {
  return std::make_unique<BpeTokenizer>(file);
}

}  // namespace ft
