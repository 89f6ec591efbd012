#include "data/tokenizer.h"

#include <sentencepiece_processor.h>

#include "core/error.h"
#include "data/sha256.h"

namespace ft {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::string path, sha256;
};

Tokenizer::Tokenizer(const std::string& model_path) : impl_(std::make_unique<Impl>()) {
  impl_->path = model_path;
  // Hash first: it also gives a clear error for a missing or unreadable file.
  impl_->sha256 = sha256_file_hex(model_path);
  auto status = impl_->sp.Load(model_path);
  if (!status.ok()) FT_FAIL(model_path, ": not a SentencePiece model (", status.ToString(), ")");
}

Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  auto status = impl_->sp.Encode({text.data(), text.size()}, &ids);
  if (!status.ok()) FT_FAIL(impl_->path, ": encoding failed: ", status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<int> v(ids.begin(), ids.end());
  std::string out;
  auto status = impl_->sp.Decode(v, &out);
  if (!status.ok()) FT_FAIL(impl_->path, ": decoding failed: ", status.ToString());
  return out;
}

int64_t Tokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }
int32_t Tokenizer::bos_id() const { return impl_->sp.bos_id(); }
int32_t Tokenizer::eos_id() const { return impl_->sp.eos_id(); }
const std::string& Tokenizer::path() const { return impl_->path; }
const std::string& Tokenizer::sha256() const { return impl_->sha256; }

}  // namespace ft
