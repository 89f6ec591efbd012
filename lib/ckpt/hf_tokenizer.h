// The tokenizer half of a Hugging Face export: from a SentencePiece model file, the files with
// which `AutoTokenizer.from_pretrained(dir)` gives exactly the ids `ft tokenize` puts in its
// shards (BOS + SentencePiece ids of the document; EOS closes the document in the shard but is
// not added by the tokenizer, so that a prompt does not end a generation before it starts):
//   tokenizer.json           the `tokenizers` pipeline: the model's precompiled normalization
//                            charsmap, SentencePiece's whitespace handling, the vocabulary with
//                            BPE merges (or Unigram scores), BOS added by the post-processor;
//   tokenizer_config.json    PreTrainedTokenizerFast (loads tokenizer.json as is: LlamaTokenizer
//                            would rebuild it without the normalizer), the special tokens,
//                            split_special_tokens (SentencePiece never reads "<s>" in text as BOS);
//   special_tokens_map.json  the special tokens by role.
// Why tokenizer.json is written here: transformers' own conversion of tokenizer.model (the
// Llama converter) drops SentencePiece's normalization, so runs of spaces, newlines, tabs,
// NFKC forms and unknown characters tokenize differently from ft's shards.
// Known differences left (tokenizers' Precompiled normalizer looks a whole grapheme cluster up
// in the charsmap and keeps only its longest matching prefix's replacement, where SentencePiece
// goes on after that prefix): a character the charsmap rewrites followed by a combining mark
// ("Ａ\u0301", "ﬁ\u0301": the mark is dropped), and "\r\n" in a model that keeps repeated
// whitespace (remove_extra_whitespaces=false: one space instead of two). tests/cli/
// test_export_transformers.sh covers everything else listed in its header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ft {

// What a SentencePiece model file says about itself (sentencepiece_model.proto; the fields the
// export needs, with proto2's defaults where a field is absent).
struct SpModelInfo {
  struct Piece {
    std::string text;
    float score = 0;
    int type = 1;  // 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
  };
  std::vector<Piece> pieces;
  int model_type = 1;  // 1 unigram, 2 BPE, 3 word, 4 char
  bool byte_fallback = false;
  bool split_by_whitespace = true;
  bool treat_whitespace_as_suffix = false;
  bool split_digits = false;
  int32_t unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;  // -1: none
  std::string normalizer_name;
  std::string precompiled_charsmap;  // raw bytes; empty for the identity normalization
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

// Parses the bytes of a .model file. Throws ft::Error naming `path` on malformed input.
SpModelInfo parse_sp_model(const std::string& bytes, const std::string& path);

// Empty when the export can reproduce this model's tokenization in tokenizer.json; otherwise
// the settings it cannot (e.g. "split_digits").
std::string unsupported_sp_settings(const SpModelInfo& sp);

// The tokenizer.json text for `sp` (unsupported_sp_settings(sp) must be empty).
std::string hf_tokenizer_json(const SpModelInfo& sp);

// The tokenizer_config.json and special_tokens_map.json texts. model_max_length: the model's
// max_seq_len.
std::string hf_tokenizer_config_json(const SpModelInfo& sp, int64_t model_max_length);
std::string hf_special_tokens_map_json(const SpModelInfo& sp);

}  // namespace ft
