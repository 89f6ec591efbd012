#include "data/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "data/sha256.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

// A tiktoken rank file (Llama 3's original/tokenizer.model): lines of "<base64> <rank>".
bool looks_like_tiktoken(const std::string& bytes) {
  const std::string line = bytes.substr(0, bytes.find('\n'));
  if (line.empty()) return false;
  const size_t sp = line.find(' ');
  if (sp == 0 || sp == std::string::npos || sp + 1 == line.size()) return false;
  for (size_t i = 0; i < sp; ++i) {
    const char c = line[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/' || c == '='))
      return false;
  }
  for (size_t i = sp + 1; i < line.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(line[i]))) return false;
  return true;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& file) {
    path_ = file;
    // Read here (a regular file of plausible size: not /dev/zero, not a FIFO), then handed to
    // the library as bytes, which it never opens itself.
    const std::string bytes =
        read_bounded_file(file, kMaxTokenizerBytes, "tokenizer",
                          "give a SentencePiece .model, a tokenizer.json or a Hugging Face folder");
    sha256_ = sha256_hex(bytes.data(), bytes.size());
    auto status = sp_.LoadFromSerializedProto(bytes);
    if (!status.ok()) {
      if (looks_like_tiktoken(bytes))
        throw UsageError(file +
                         ": a tiktoken rank file (lines of base64 token and rank), which ft does "
                         "not read; give the model's Hugging Face tokenizer.json instead");
      // The library's own message names its source file and line: not for a user.
      throw UsageError(file + ": not a SentencePiece model (" +
                       (status.code() == sentencepiece::util::StatusCode::kInternal
                            ? "its bytes do not parse as one, or it is inconsistent"
                            : "the SentencePiece library refused it") +
                       "); give a SentencePiece .model, a tokenizer.json (a .json file) or a "
                       "Hugging Face folder");
    }
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    auto status = sp_.Encode({text.data(), text.size()}, &ids);
    if (!status.ok()) FT_FAIL(path_, ": encoding failed: ", status.ToString());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> v(ids.begin(), ids.end());
    std::string out;
    auto status = sp_.Decode(v, &out);
    if (!status.ok()) FT_FAIL(path_, ": decoding failed: ", status.ToString());
    return out;
  }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }

 private:
  sentencepiece::SentencePieceProcessor sp_;  // Encode/Decode are const: thread-safe
};

}  // namespace

std::vector<int32_t> Tokenizer::encode_with_offsets(
    std::string_view text, std::vector<std::pair<size_t, size_t>>* offsets) const {
  std::vector<int32_t> ids = encode(text);
  offsets->clear();
  size_t at = 0;
  for (int32_t id : ids) {
    const std::string piece = decode({id});
    if (text.substr(at, piece.size()) != piece)
      FT_FAIL(path(), ": the tokens of the text do not spell it at byte ", at,
              ", so they cannot be mapped back to it (give a byte-level BPE tokenizer.json)");
    offsets->emplace_back(at, at + piece.size());
    at += piece.size();
  }
  if (at != text.size()) FT_FAIL(path(), ": the tokens of the text do not spell all of it");
  return ids;
}

std::string resolve_tokenizer_file(const std::string& path) {
  std::error_code ec;
  const std::string hint =
      "give a tokenizer.model or tokenizer.json file, or the Hugging Face folder holding one";
  // The file is checked here, before anything reads or hashes it (a FIFO would block, a device
  // never end).
  if (!fs::is_directory(path, ec)) {
    check_regular_file(path, kMaxTokenizerBytes, "tokenizer", hint);
    return path;
  }
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    const fs::path p = fs::path(path) / name;
    if (fs::exists(fs::symlink_status(p, ec))) {
      check_regular_file(p.string(), kMaxTokenizerBytes, "tokenizer", hint);
      return p.string();
    }
  }
  if (fs::exists(fs::path(path) / "tekken.json", ec))
    throw UsageError(path +
                     ": holds tekken.json (Mistral's tokenizer format), which ft does not read; "
                     "give a folder or file with tokenizer.json or tokenizer.model");
  throw UsageError(path +
                   ": a folder without tokenizer.model or tokenizer.json; give the tokenizer "
                   "file, or the Hugging Face model folder that holds it");
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const std::string file = resolve_tokenizer_file(path);
  // A tokenizer file that cannot be read as one is bad input, as a missing one is: exit 2.
  try {
    if (fs::path(file).extension() == ".json") return load_bpe_tokenizer(file);
    return load_sentencepiece_tokenizer(file);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& file) {
  return std::make_unique<SentencePieceTokenizer>(file);
}

}  // namespace ft
