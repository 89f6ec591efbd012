#include "data/tokenize.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/system.h"
#include "data/chat.h"
#include "data/shard.h"
#include "data/tokenizer.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A batch is encoded in parallel, then written in order. Its size bounds memory (the text and
// the ids of one batch) while giving every thread plenty of documents.
constexpr size_t kBatchDocs = 8192;
constexpr size_t kBatchBytes = 16u << 20;
constexpr double kProgressEverySeconds = 2.0;

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
  });
}

// Reads documents one at a time from a text or JSONL file (formats: tokenize.h).
class DocumentReader {
 public:
  DocumentReader(const std::string& path, bool jsonl, const std::string& field)
      : in_(path, std::ios::binary), path_(path), jsonl_(jsonl), field_(field) {
    if (!in_) FT_FAIL("cannot open ", path, " for reading");
  }

  // The next conversation of a chat or alpaca JSONL file (chat.h), or false at its end.
  bool next_conversation(bool alpaca, jinja::Json* conv) {
    std::string line;
    while (std::getline(in_, line)) {
      ++line_no_;
      bytes_ += line.size() + 1;
      if (is_blank(line)) continue;
      const std::string where = path_ + ":" + std::to_string(line_no_);
      jinja::Json j;
      try {
        j = jinja::Json::parse(line);
      } catch (const jinja::Json::parse_error& e) {
        throw UsageError(where + ": not valid JSON (" + e.what() +
                         "); JSONL needs one JSON object per line");
      }
      if (!j.is_object())
        throw UsageError(where + ": expected a JSON object, got " + j.type_name());
      *conv = conversation_from_record(j, alpaca, where);
      return true;
    }
    if (in_.bad()) FT_FAIL("error while reading ", path_, " near line ", line_no_);
    return false;
  }
  uint64_t line_no() const { return line_no_; }

  // The next document, or false at the end of the file.
  bool next(std::string* doc) {
    doc->clear();
    std::string line;
    while (std::getline(in_, line)) {
      ++line_no_;
      bytes_ += line.size() + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (jsonl_) {
        if (is_blank(line)) continue;
        *doc = parse_jsonl(line);
        return true;
      }
      if (is_blank(line)) {
        if (!doc->empty()) return true;
        continue;
      }
      if (!doc->empty()) *doc += '\n';
      *doc += line;
    }
    if (in_.bad()) FT_FAIL("error while reading ", path_, " near line ", line_no_);
    return !jsonl_ && !doc->empty();
  }

  uint64_t bytes_read() const { return bytes_; }

 private:
  std::string parse_jsonl(const std::string& line) const {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw UsageError(detail::concat(path_, ":", line_no_, ": not valid JSON (", e.what(),
                                      "); JSONL needs one JSON object per line"));
    }
    if (!j.is_object())
      throw UsageError(
          detail::concat(path_, ":", line_no_, ": expected a JSON object, got ", j.type_name()));
    auto it = j.find(field_);
    if (it == j.end())
      throw UsageError(detail::concat(path_, ":", line_no_, ": no field \"", field_,
                                      "\" (choose the text field with --field NAME)"));
    if (!it->is_string())
      throw UsageError(detail::concat(path_, ":", line_no_, ": field \"", field_, "\" is a ",
                                      it->type_name(), ", expected a string"));
    return it->get<std::string>();
  }

  std::ifstream in_;
  std::string path_;
  bool jsonl_;
  std::string field_;
  uint64_t line_no_ = 0, bytes_ = 0;
};

bool is_chat_format(const std::string& format) { return format == "chat" || format == "alpaca"; }

bool is_jsonl(const std::string& path, const std::string& format) {
  if (format == "jsonl" || is_chat_format(format)) return true;
  if (format == "text") return false;
  if (format != "auto")
    throw UsageError("--format must be auto, text, jsonl, chat or alpaca, got " + format);
  std::string ext = fs::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json";
}

// Runs encode_one(i) for i in [0, count) on `threads` workers; the first exception of any
// worker is rethrown here.
template <class F>
void parallel_for(size_t count, int threads, F&& encode_one) {
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < count;) encode_one(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      next = count;  // stop the others early
    }
  };
  const int n = std::max(1, std::min<int>(threads, int(count)));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// Encodes docs[i] into out[i] = BOS + ids + EOS (-1: none).
void encode_batch(const Tokenizer& tok, int32_t bos, int32_t eos,
                  const std::vector<std::string>& docs, std::vector<std::vector<int32_t>>* out,
                  int threads) {
  out->assign(docs.size(), {});
  parallel_for(docs.size(), threads, [&](size_t i) {
    std::vector<int32_t> ids = tok.encode(docs[i]);
    std::vector<int32_t>& d = (*out)[i];
    d.reserve(ids.size() + 2);
    if (bos >= 0) d.push_back(bos);
    d.insert(d.end(), ids.begin(), ids.end());
    if (eos >= 0) d.push_back(eos);
  });
}

// Renders, tokenizes and masks conversations (chat.h); where[i] names convs[i] in errors.
void encode_chat_batch(const ChatTemplate& t, const Tokenizer& tok, bool with_mask,
                       const std::vector<jinja::Json>& convs, const std::vector<std::string>& where,
                       std::vector<ChatTokens>* out, int threads) {
  out->assign(convs.size(), {});
  parallel_for(convs.size(), threads, [&](size_t i) {
    try {
      (*out)[i] = tokenize_chat(t, tok, convs[i], with_mask);
    } catch (const UsageError& e) {
      throw UsageError(where[i] + ": " + e.what());
    } catch (const Error& e) {
      FT_FAIL(where[i], ": ", e.what());
    }
  });
}

// The EOS that ends each text document: the tokenizer's (tokenizer.json's post-processor),
// else tokenizer_config.json's eos_token when it is one special token (Qwen2's files keep
// <|endoftext|> only there), else -1.
int32_t document_eos_id(const std::string& tokenizer_path, const Tokenizer& tok) {
  if (tok.eos_id() >= 0 || fs::path(tok.path()).extension() != ".json") return tok.eos_id();
  const jinja::Json special = load_special_tokens(tokenizer_path);
  if (!special.contains("eos_token")) return -1;
  const std::vector<int32_t> ids = tok.encode(special["eos_token"].get<std::string>());
  return ids.size() == 1 && tok.is_special(ids[0]) ? ids[0] : -1;
}

std::string human_count(double v) {
  char buf[32];
  if (v >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.2fG", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2fM", v / 1e6);
  else if (v >= 1e4)
    std::snprintf(buf, sizeof(buf), "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  return buf;
}

}  // namespace

std::string shard_file_name(int64_t index) {
  FT_CHECK(index >= 0 && index <= 99999, "more than 100000 shards; raise --shard-tokens");
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard_%05lld.h5", (long long)index);
  return buf;
}

TokenizeSummary tokenize_to_shards(const TokenizeOptions& opt) {
  const auto t0 = Clock::now();
  if (opt.inputs.empty()) throw UsageError("ft tokenize: no --input files");
  if (opt.shard_tokens < 1) throw UsageError("--shard-tokens must be positive");
  const int threads = opt.threads > 0 ? opt.threads : available_cores();

  // Check everything cheap before the long part: inputs exist, output is not an old shard set.
  uint64_t total_bytes = 0;
  for (const std::string& in : opt.inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(in, ec)) throw UsageError(in + ": no such input file");
    total_bytes += fs::file_size(in, ec);
    is_jsonl(in, opt.format);
  }
  std::error_code ec;
  fs::create_directories(opt.output_dir, ec);
  if (!fs::is_directory(opt.output_dir, ec))
    FT_FAIL(opt.output_dir, ": cannot create the output folder");
  for (const auto& e : fs::directory_iterator(opt.output_dir, ec))
    if (e.path().extension() == ".h5")
      throw UsageError(opt.output_dir + " already holds shards (" + e.path().filename().string() +
                       "); remove them or choose another --output");

  const std::unique_ptr<Tokenizer> tok_ptr = load_tokenizer(opt.tokenizer);
  const Tokenizer& tok = *tok_ptr;
  ShardAttributes attrs;
  attrs.vocab_size = tok.vocab_size();
  attrs.bos_id = tok.bos_id();
  attrs.eos_id = document_eos_id(opt.tokenizer, tok);
  attrs.tokenizer_sha256 = tok.sha256();
  ShardWriter::Options wopt;
  wopt.chunk_tokens = uint64_t(std::min<int64_t>(opt.shard_tokens, int64_t(1) << 16));
  const bool chat = is_chat_format(opt.format);
  std::unique_ptr<ChatTemplate> chat_template;
  if (chat) {
    if (fs::path(tok.path()).extension() != ".json")
      throw UsageError(tok.path() + ": --format " + opt.format +
                       " needs a Hugging Face tokenizer.json with a byte-level BPE model (a "
                       "SentencePiece model does not match the special tokens a chat template "
                       "writes, so Mistral's and Llama 2's tokenizers cannot make chat data yet)");
    chat_template = std::make_unique<ChatTemplate>(load_chat_template(opt.tokenizer));
    wopt.loss_mask = !opt.train_on_prompt;
  }

  TokenizeSummary sum;
  std::unique_ptr<ShardWriter> writer;
  auto close_shard = [&] {
    if (!writer) return;
    writer->close();
    writer.reset();
  };
  auto write_doc = [&](const std::vector<int32_t>& ids, const std::vector<uint8_t>* mask) {
    if (writer && writer->num_tokens() > 0 &&
        writer->num_tokens() + ids.size() > uint64_t(opt.shard_tokens))
      close_shard();
    if (!writer) {
      std::string path = (fs::path(opt.output_dir) / shard_file_name(sum.shards)).string();
      writer = std::make_unique<ShardWriter>(path, attrs, wopt);
      sum.shard_paths.push_back(path);
      ++sum.shards;
    }
    writer->add_document(ids, wopt.loss_mask ? mask : nullptr);
    ++sum.documents;
    sum.tokens += ids.size();
  };

  // An input error half way (a bad JSONL line) must not leave a folder of complete-looking
  // shards that hold only part of the inputs: remove what this run wrote, then rethrow.
  try {
    uint64_t bytes_done = 0;
    auto last_report = Clock::now();
    std::vector<std::string> docs, where;
    std::vector<std::vector<int32_t>> encoded;
    std::vector<jinja::Json> convs;
    std::vector<ChatTokens> chat_encoded;
    for (const std::string& in : opt.inputs) {
      DocumentReader reader(in, is_jsonl(in, opt.format), opt.field);
      bool more = true;
      while (more) {
        docs.clear();
        convs.clear();
        where.clear();
        size_t batch_bytes = 0;
        std::string doc;
        jinja::Json conv;
        if (chat) {
          const uint64_t batch_start = reader.bytes_read();
          while (convs.size() < kBatchDocs && reader.bytes_read() - batch_start < kBatchBytes &&
                 (more = reader.next_conversation(opt.format == "alpaca", &conv))) {
            convs.push_back(std::move(conv));
            where.push_back(in + ":" + std::to_string(reader.line_no()));
          }
          encode_chat_batch(*chat_template, tok, wopt.loss_mask, convs, where, &chat_encoded,
                            threads);
          for (const ChatTokens& c : chat_encoded) write_doc(c.ids, &c.mask);
        } else {
          while (docs.size() < kBatchDocs && batch_bytes < kBatchBytes &&
                 (more = reader.next(&doc))) {
            batch_bytes += doc.size();
            docs.push_back(std::move(doc));
          }
          try {
            encode_batch(tok, attrs.bos_id, attrs.eos_id, docs, &encoded, threads);
          } catch (const Error& e) {
            FT_FAIL(in, ": ", e.what());
          }
          for (const auto& ids : encoded) write_doc(ids, nullptr);
        }
        if (opt.progress && std::chrono::duration<double>(Clock::now() - last_report).count() >=
                                kProgressEverySeconds) {
          last_report = Clock::now();
          const double secs = std::chrono::duration<double>(last_report - t0).count();
          const uint64_t done = bytes_done + reader.bytes_read();
          log_info(
              "tokenize: ", int(100.0 * double(done) / double(std::max<uint64_t>(total_bytes, 1))),
              "% (", done >> 20, "/", total_bytes >> 20, " MiB) ", in, ": ",
              human_count(double(sum.documents)), " documents, ", human_count(double(sum.tokens)),
              " tokens, ", human_count(double(sum.tokens) / secs), " tokens/s");
        }
      }
      bytes_done += reader.bytes_read();
      ++sum.files;
    }
    close_shard();
  } catch (...) {
    writer.reset();  // deletes its .tmp file
    for (const std::string& p : sum.shard_paths) std::remove(p.c_str());
    throw;
  }
  if (sum.documents == 0)
    throw UsageError("no documents in the input files (empty, or only blank lines)");
  sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return sum;
}

}  // namespace ft
