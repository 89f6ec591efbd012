// SentencePiece model → Hugging Face tokenizer files (hf_tokenizer.h).
//
// How SentencePiece encodes (normalizer.cc, bpe_model.cc), and the `tokenizers` stage that
// reproduces each step:
//   1. the precompiled charsmap (NFKC plus the nmt rules: tabs and newlines become spaces,
//      control characters vanish)                          → normalizer Precompiled;
//   2. remove_extra_whitespaces: runs of ' ' become one, a leading and a trailing ' ' go
//                                                           → Replace " {2,}" → " ", "^ | $" → "";
//   3. add_dummy_prefix                                     → normalizer Prepend '▁';
//      ' ' → '▁', words split at '▁'                         → pre-tokenizer Metaspace;
//   4. BPE: repeatedly merge the adjacent pair whose concatenation is the highest-scoring piece
//                                                           → BPE merges ranked by that score;
//      or Unigram: the Viterbi segmentation                 → Unigram with the same scores;
//   5. characters no piece covers become <unk>, a run of them one <unk> → fuse_unk.
// The model file is read with a small protobuf wire-format reader: the Debian package ships no
// sentencepiece_model.pb.h, and the few fields needed here do not justify protobuf itself.
#include "ckpt/hf_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "core/error.h"

namespace ft {
namespace {

using nlohmann::ordered_json;

// Protobuf wire format: a message is a run of (tag varint, value); tag = field << 3 | wire type.
class WireReader {
 public:
  WireReader(std::string_view data, const std::string& path) : d_(data), path_(path) {}
  bool done() const { return pos_ >= d_.size(); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= d_.size()) bad("truncated varint");
      const uint8_t b = uint8_t(d_[pos_++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    bad("varint longer than 10 bytes");
  }
  // Reads a tag; returns the field number and sets *wire.
  uint32_t tag(int* wire) {
    const uint64_t t = varint();
    *wire = int(t & 7);
    return uint32_t(t >> 3);
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    if (n > d_.size() - pos_) bad("length-delimited field runs past the end");
    std::string_view s = d_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  float fixed32_float() {
    if (d_.size() - pos_ < 4) bad("truncated fixed32");
    float f;
    std::memcpy(&f, d_.data() + pos_, 4);  // little-endian on every platform ft builds for
    pos_ += 4;
    return f;
  }
  void skip(int wire) {
    switch (wire) {
      case 0:
        varint();
        break;
      case 1:
        advance(8);
        break;
      case 2:
        bytes();
        break;
      case 5:
        advance(4);
        break;
      default:
        bad("unsupported wire type " + std::to_string(wire));
    }
  }

  [[noreturn]] void bad(const std::string& what) const {
    throw Error(path_ + ": not a SentencePiece model (" + what + " at byte " +
                std::to_string(pos_) + ")");
  }

 private:
  void advance(size_t n) {
    if (d_.size() - pos_ < n) bad("truncated field");
    pos_ += n;
  }
  std::string_view d_;
  const std::string& path_;
  size_t pos_ = 0;
};

SpModelInfo::Piece parse_piece(std::string_view data, const std::string& path) {
  SpModelInfo::Piece p;
  WireReader r(data, path);
  while (!r.done()) {
    int wire;
    const uint32_t field = r.tag(&wire);
    if (field == 1 && wire == 2)
      p.text = std::string(r.bytes());
    else if (field == 2 && wire == 5)
      p.score = r.fixed32_float();
    else if (field == 3 && wire == 0)
      p.type = int(r.varint());
    else
      r.skip(wire);
  }
  return p;
}

void parse_trainer_spec(std::string_view data, const std::string& path, SpModelInfo* sp) {
  WireReader r(data, path);
  while (!r.done()) {
    int wire;
    const uint32_t field = r.tag(&wire);
    if (wire != 0) {
      r.skip(wire);
      continue;
    }
    // int32 fields: a negative id (pad_id = -1) is a 10-byte varint of the sign-extended value.
    const int64_t v = int64_t(r.varint());
    switch (field) {
      case 3:
        sp->model_type = int(v);
        break;
      case 22:
        sp->split_by_whitespace = v != 0;
        break;
      case 24:
        sp->treat_whitespace_as_suffix = v != 0;
        break;
      case 25:
        sp->split_digits = v != 0;
        break;
      case 35:
        sp->byte_fallback = v != 0;
        break;
      case 40:
        sp->unk_id = int32_t(v);
        break;
      case 41:
        sp->bos_id = int32_t(v);
        break;
      case 42:
        sp->eos_id = int32_t(v);
        break;
      case 43:
        sp->pad_id = int32_t(v);
        break;
      default:
        break;
    }
  }
}

void parse_normalizer_spec(std::string_view data, const std::string& path, SpModelInfo* sp) {
  WireReader r(data, path);
  while (!r.done()) {
    int wire;
    const uint32_t field = r.tag(&wire);
    if (field == 1 && wire == 2)
      sp->normalizer_name = std::string(r.bytes());
    else if (field == 2 && wire == 2)
      sp->precompiled_charsmap = std::string(r.bytes());
    else if (field == 3 && wire == 0)
      sp->add_dummy_prefix = r.varint() != 0;
    else if (field == 4 && wire == 0)
      sp->remove_extra_whitespaces = r.varint() != 0;
    else if (field == 5 && wire == 0)
      sp->escape_whitespaces = r.varint() != 0;
    else
      r.skip(wire);
  }
}

std::string base64(const std::string& in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v =
        uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
    for (int k = 3; k >= 0; --k) out += kAlphabet[(v >> (6 * k)) & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// Strict UTF-8 (no overlong forms, surrogates or values past U+10FFFF): every piece must be, as
// SentencePiece requires, and JSON output needs it.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = uint8_t(s[i]);
    int n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else
      return false;
    if (s.size() - i <= size_t(n)) return false;
    for (int k = 1; k <= n; ++k) {
      const uint8_t d = uint8_t(s[i + size_t(k)]);
      if ((d & 0xc0) != 0x80) return false;
      cp = cp << 6 | (d & 0x3f);
    }
    static const uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += size_t(n) + 1;
  }
  return true;
}

constexpr int kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

const std::string& piece_text(const SpModelInfo& sp, int32_t id) {
  FT_CHECK(id >= 0 && size_t(id) < sp.pieces.size(), "special id ", id, " outside the ",
           sp.pieces.size(), " pieces");
  return sp.pieces[size_t(id)].text;
}

// BPE merges: every split of a normal piece into two normal pieces, ranked as SentencePiece
// merges, by the merged piece's score (higher first; ties by id, which is SentencePiece's order).
ordered_json bpe_merges(const SpModelInfo& sp) {
  std::unordered_map<std::string_view, size_t> id;
  for (size_t i = 0; i < sp.pieces.size(); ++i)
    if (sp.pieces[i].type == kNormal) id.emplace(sp.pieces[i].text, i);
  struct Merge {
    float score;
    size_t piece, left;
    size_t split;  // bytes in the left part
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < sp.pieces.size(); ++i) {
    const SpModelInfo::Piece& p = sp.pieces[i];
    if (p.type != kNormal) continue;
    const std::string_view s = p.text;
    for (size_t k = 1; k < s.size(); ++k) {
      if ((uint8_t(s[k]) & 0xc0) == 0x80) continue;  // inside a UTF-8 character
      auto a = id.find(s.substr(0, k)), b = id.find(s.substr(k));
      if (a != id.end() && b != id.end()) merges.push_back({p.score, i, a->second, k});
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& x, const Merge& y) {
    return std::make_tuple(-x.score, x.piece, x.left) < std::make_tuple(-y.score, y.piece, y.left);
  });
  ordered_json out = ordered_json::array();
  for (const Merge& m : merges) {
    const std::string& s = sp.pieces[m.piece].text;
    out.push_back({s.substr(0, m.split), s.substr(m.split)});
  }
  return out;
}

ordered_json special_token(const std::string& text) {
  return {{"SpecialToken", {{"id", text}, {"type_id", 0}}}};
}

}  // namespace

SpModelInfo parse_sp_model(const std::string& bytes, const std::string& path) {
  SpModelInfo sp;
  WireReader r(bytes, path);
  while (!r.done()) {
    int wire;
    const uint32_t field = r.tag(&wire);
    if (wire == 2 && field == 1)
      sp.pieces.push_back(parse_piece(r.bytes(), path));
    else if (wire == 2 && field == 2)
      parse_trainer_spec(r.bytes(), path, &sp);
    else if (wire == 2 && field == 3)
      parse_normalizer_spec(r.bytes(), path, &sp);
    else
      r.skip(wire);
  }
  if (sp.pieces.empty()) r.bad("no pieces");
  std::unordered_map<std::string_view, size_t> seen;
  for (size_t i = 0; i < sp.pieces.size(); ++i) {
    const std::string& t = sp.pieces[i].text;
    if (t.empty() || !valid_utf8(t)) r.bad("piece " + std::to_string(i) + " is empty or not UTF-8");
    // A NaN would break the merge sort's ordering; SentencePiece writes finite log-probabilities.
    if (!std::isfinite(sp.pieces[i].score))
      r.bad("piece " + std::to_string(i) + " has a non-finite score");
    if (!seen.emplace(t, i).second)
      r.bad("piece " + std::to_string(i) + " repeats piece " + std::to_string(seen[t]));
  }
  for (int32_t id : {sp.unk_id, sp.bos_id, sp.eos_id, sp.pad_id})
    if (id < -1 || id >= int32_t(sp.pieces.size()))
      r.bad("special id " + std::to_string(id) + " outside the " +
            std::to_string(sp.pieces.size()) + " pieces");
  if (sp.unk_id < 0) r.bad("no unknown piece");
  return sp;
}

std::string unsupported_sp_settings(const SpModelInfo& sp) {
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  if (sp.model_type != 1 && sp.model_type != 2)
    add("model_type " + std::to_string(sp.model_type) + " (only unigram and bpe)");
  if (!sp.escape_whitespaces) add("escape_whitespaces=false");
  if (sp.treat_whitespace_as_suffix) add("treat_whitespace_as_suffix");
  if (sp.split_digits) add("split_digits");
  int user = 0, unused = 0;
  for (const auto& p : sp.pieces) {
    user += p.type == kUserDefined;
    unused += p.type == kUnused;
  }
  // User-defined pieces are matched in the raw text by SentencePiece; unused ones are skipped by
  // its Unigram search. Neither is exercised by a test here, so neither is claimed.
  if (user) add(std::to_string(user) + " user-defined pieces");
  if (unused) add(std::to_string(unused) + " unused pieces");
  return out;
}

std::string hf_tokenizer_json(const SpModelInfo& sp) {
  FT_CHECK(unsupported_sp_settings(sp).empty(), "hf_tokenizer_json: unsupported model");
  ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  // <unk> and the control pieces (<s>, </s>, a pad) are special: never produced by the model's
  // segmentation, only by the post-processor (BOS) or by the caller. normalized=false keeps the
  // normalizer off them; tokenizer_config.json's split_special_tokens keeps them from being
  // matched in text, as SentencePiece never matches them.
  ordered_json added = ordered_json::array();
  for (size_t i = 0; i < sp.pieces.size(); ++i) {
    const SpModelInfo::Piece& p = sp.pieces[i];
    if (p.type != kUnknown && p.type != kControl) continue;
    added.push_back({{"id", i},
                     {"content", p.text},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  j["added_tokens"] = added;

  ordered_json norms = ordered_json::array();
  if (!sp.precompiled_charsmap.empty())
    norms.push_back(
        {{"type", "Precompiled"}, {"precompiled_charsmap", base64(sp.precompiled_charsmap)}});
  if (sp.remove_extra_whitespaces) {
    // Only ' ' (after the charsmap), as SentencePiece: a tab survives the identity normalization.
    norms.push_back({{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}});
    norms.push_back({{"type", "Replace"}, {"pattern", {{"Regex", "^ | $"}}}, {"content", ""}});
  }
  const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's visible space
  // The dummy prefix as a normalizer, not as Metaspace's prepend_scheme "always": that one adds
  // nothing to a text that already starts with a space, where SentencePiece adds its '▁'
  // regardless (" a" is "▁", "▁a" when whitespace is kept). Prepend leaves an empty text empty.
  if (sp.add_dummy_prefix) norms.push_back({{"type", "Prepend"}, {"prepend", kSpace}});
  j["normalizer"] = norms.empty() ? ordered_json(nullptr)
                                  : ordered_json{{"type", "Sequence"}, {"normalizers", norms}};
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", kSpace},
                        {"prepend_scheme", "never"},
                        {"split", sp.split_by_whitespace}};

  // BOS before each sequence, as ft tokenize; no EOS (hf_tokenizer.h says why).
  if (sp.bos_id >= 0) {
    const std::string& bos = piece_text(sp, sp.bos_id);
    ordered_json seq_a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
    ordered_json seq_b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
    ordered_json bos_b = {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}};
    j["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", {special_token(bos), seq_a}},
        {"pair", {special_token(bos), seq_a, bos_b, seq_b}},
        {"special_tokens", {{bos, {{"id", bos}, {"ids", {sp.bos_id}}, {"tokens", {bos}}}}}}};
  } else {
    j["post_processor"] = nullptr;
  }
  // '▁' back to ' ', byte pieces <0xNN> back to bytes, the dummy prefix's space dropped.
  ordered_json decoders = ordered_json::array();
  decoders.push_back({{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}});
  decoders.push_back({{"type", "ByteFallback"}});
  decoders.push_back({{"type", "Fuse"}});
  if (sp.add_dummy_prefix)
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};

  const std::string& unk = piece_text(sp, sp.unk_id);
  if (sp.model_type == 2) {
    ordered_json vocab = ordered_json::object();
    for (size_t i = 0; i < sp.pieces.size(); ++i) vocab[sp.pieces[i].text] = i;
    j["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", unk},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", true},
                  {"byte_fallback", sp.byte_fallback},
                  {"ignore_merges", false},
                  {"vocab", vocab},
                  {"merges", bpe_merges(sp)}};
  } else {
    // SentencePiece leaves <unk> and control pieces out of the Unigram search; `tokenizers`
    // searches every entry, so text such as "<s>" would become the control piece (score 0, the
    // best there is). A score 1000 below the lowest normal one keeps them out of any segmentation
    // that can avoid them; where a character has no piece, every path takes the <unk> node, so
    // the lower minimum (tokenizers' <unk> score is the minimum minus 10) changes no choice.
    float min_normal = 0;
    for (const SpModelInfo::Piece& p : sp.pieces)
      if (p.type == kNormal) min_normal = std::min(min_normal, p.score);
    ordered_json vocab = ordered_json::array();
    for (const SpModelInfo::Piece& p : sp.pieces)
      vocab.push_back({p.text, p.type == kNormal || p.type == kByte ? p.score : min_normal - 1000});
    j["model"] = {{"type", "Unigram"},
                  {"unk_id", sp.unk_id},
                  {"vocab", vocab},
                  {"byte_fallback", sp.byte_fallback}};
  }
  return j.dump(2) + "\n";
}

std::string hf_special_tokens_map_json(const SpModelInfo& sp) {
  ordered_json j = ordered_json::object();
  if (sp.bos_id >= 0) j["bos_token"] = piece_text(sp, sp.bos_id);
  if (sp.eos_id >= 0) j["eos_token"] = piece_text(sp, sp.eos_id);
  j["unk_token"] = piece_text(sp, sp.unk_id);
  if (sp.pad_id >= 0) j["pad_token"] = piece_text(sp, sp.pad_id);
  return j.dump(2) + "\n";
}

std::string hf_tokenizer_config_json(const SpModelInfo& sp, int64_t model_max_length) {
  ordered_json j;
  // PreTrainedTokenizerFast (TokenizersBackend in transformers 5) loads tokenizer.json as it
  // is; a model class such as LlamaTokenizer rebuilds the pipeline and drops the normalizer.
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  auto token = [&](int32_t id) {
    return id >= 0 ? ordered_json(piece_text(sp, id)) : ordered_json(nullptr);
  };
  j["bos_token"] = token(sp.bos_id);
  j["eos_token"] = token(sp.eos_id);
  j["unk_token"] = token(sp.unk_id);
  j["pad_token"] = token(sp.pad_id);
  // What ft tokenize does (documentation for readers: tokenizer.json's post-processor is what
  // adds BOS).
  j["add_bos_token"] = sp.bos_id >= 0;
  j["add_eos_token"] = false;
  j["split_special_tokens"] = true;
  j["clean_up_tokenization_spaces"] = false;
  j["model_max_length"] = model_max_length;
  // A Llama takes no token_type_ids: without this, model(**tokenizer(text)) and generate refuse
  // the extra key PreTrainedTokenizerFast returns by default.
  j["model_input_names"] = {"input_ids", "attention_mask"};
  return j.dump(2) + "\n";
}

}  // namespace ft
