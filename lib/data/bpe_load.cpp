// Reading a Hugging Face tokenizer.json into a BpeTokenizer (bpe_internal.h): each part checked
// against what ft encodes, an error naming the file and key of what it refuses; the vocabulary
// translated to raw bytes, the pre-tokenizer regexes compiled.
#include "data/bpe_internal.h"

#include "core/files.h"
#include "core/json_describe.h"
#include "core/utf8.h"
#include "data/sha256.h"

namespace ft::detail {
namespace {

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

}  // namespace

Regex::Regex(const std::string& pattern, bool literal, const std::string& where) {
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

BpeTokenizer::BpeTokenizer(const std::string& file) : file_(file) {
  path_ = file;
  const std::string text = read_bounded_file(
      file, kMaxTokenizerBytes, "tokenizer",
      "give a Hugging Face tokenizer.json, a SentencePiece .model or a Hugging Face folder");
  sha256_ = sha256_hex(text.data(), text.size());
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
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

}  // namespace ft::detail

namespace ft {

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& file) {
  return std::make_unique<detail::BpeTokenizer>(file);
}

}  // namespace ft
