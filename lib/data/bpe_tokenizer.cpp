// Encoding with a loaded BpeTokenizer (bpe_internal.h: the pipeline, steps 0-4) and decoding.
#include "data/bpe_internal.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <functional>
#include <queue>

#include "core/utf8.h"

namespace ft::detail {

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

namespace {

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

}  // namespace

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

}  // namespace ft::detail
