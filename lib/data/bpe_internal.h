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
// Byte-level BPE writes each byte as a printable code point (GPT-2's bytes_to_unicode:
// bpe_load.cpp); the vocabulary is translated back to raw bytes once at load, so encoding never
// maps bytes. Regexes are PCRE2 with UTF and UCP (\p{..}, \d, \w by Unicode properties; \s
// rewritten as Unicode White_Space, which is Oniguruma's), JIT-compiled.
//
// This header is what the two files share (nothing outside lib/data includes it):
//   bpe_load.cpp       reading tokenizer.json: each part checked, the regexes compiled
//   bpe_tokenizer.cpp  encoding (steps 0-4) and decoding
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"

namespace ft::detail {

using json = nlohmann::json;

// Decodes one UTF-8 code point at s[i] (s valid UTF-8); advances i.
inline uint32_t next_code_point(std::string_view s, size_t* i) {
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

// NFC of valid UTF-8 (bpe_tokenizer.cpp).
std::string nfc(std::string_view s);

// A compiled PCRE2 pattern, shared read-only by all threads; each thread matches with its own
// match data and JIT stack (MatchState).
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where);
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

}  // namespace ft::detail
