#include "data/tokenize.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/system.h"
#include "data/chat.h"
#include "data/preference.h"
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

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
  });
}

// Stops the run when the caller's stop flag is set (a signal): what was written is removed
// on the way out (tokenize_to_shards), and the exit code is 128 + the signal's number, as a
// shell reports a process the signal ended.
void check_stop(const std::atomic<int>* stop) {
  if (!stop) return;
  const int sig = stop->load();
  if (sig == 0) return;
  throw Error(std::string("ft tokenize: stopped by ") +
                  (sig == 2    ? "SIGINT"
                   : sig == 15 ? "SIGTERM"
                               : "signal " + std::to_string(sig)) +
                  "; removed what it had written",
              ExitCode(128 + sig));
}

// Reads a file line by line, each line at most `max_bytes` (a longer one is an error naming
// the line, not read into memory).
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path) {
    in_ = std::fopen(path.c_str(), "rb");
    if (!in_) FT_FAIL("cannot open ", path, " for reading");
    buf_.resize(1 << 20);
  }
  ~LineReader() { std::fclose(in_); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line (without its "\n") into *line; false at the end of the file.
  bool next(std::string* line, size_t max_bytes) {
    line->clear();
    bool any = false;
    for (;;) {
      if (pos_ == len_) {
        len_ = std::fread(buf_.data(), 1, buf_.size(), in_);
        pos_ = 0;
        if (len_ == 0) {
          if (std::ferror(in_)) FT_FAIL("error while reading ", path_, " near line ", line_no_ + 1);
          if (any) ++line_no_;
          return any;
        }
      }
      any = true;
      const char* start = buf_.data() + pos_;
      const char* nl = static_cast<const char*>(std::memchr(start, '\n', len_ - pos_));
      const size_t n = nl ? size_t(nl - start) : len_ - pos_;
      if (line->size() + n > max_bytes)
        throw UsageError(path_ + ":" + std::to_string(line_no_ + 1) + ": a line longer than " +
                         std::to_string(max_bytes >> 20) +
                         " MiB; a JSONL record is one line, and none is that long (is it "
                         "JSONL? --format text reads plain text)");
      line->append(start, n);
      pos_ += n;
      bytes_ += n;
      if (nl) {
        ++pos_;
        ++bytes_;
        ++line_no_;
        return true;
      }
    }
  }
  uint64_t line_no() const { return line_no_; }
  uint64_t bytes_read() const { return bytes_; }

 private:
  std::string path_;
  std::FILE* in_ = nullptr;
  std::vector<char> buf_;
  size_t pos_ = 0, len_ = 0;
  uint64_t line_no_ = 0, bytes_ = 0;
};

// Reads documents one at a time from a text or JSONL file (formats: tokenize.h).
class DocumentReader {
 public:
  DocumentReader(const std::string& path, bool jsonl, const std::string& field)
      : in_(path), path_(path), jsonl_(jsonl), field_(field) {}

  // The next record of a JSONL file, a JSON object, or false at its end.
  bool next_record(jinja::Json* record) {
    std::string line;
    while (in_.next(&line, kMaxJsonlLineBytes)) {
      if (is_blank(line)) continue;
      *record = parse_jsonl_line(line, where());
      if (!record->is_object())
        throw UsageError(where() + ": expected a JSON object, got " + record->type_name());
      return true;
    }
    return false;
  }

  // The next conversation of a chat or alpaca JSONL file (chat.h), or false at its end.
  bool next_conversation(bool alpaca, jinja::Json* conv) {
    jinja::Json record;
    if (!next_record(&record)) return false;
    *conv = conversation_from_record(record, alpaca, where());
    return true;
  }

  // The next record of a preference JSONL file (preference.h), or false at its end.
  bool next_preference(PreferenceRecord* pref) {
    jinja::Json record;
    if (!next_record(&record)) return false;
    *pref = preference_from_record(record, where());
    return true;
  }

  uint64_t line_no() const { return in_.line_no(); }
  // file:line of the last line read, for messages.
  std::string where() const { return path_ + ":" + std::to_string(in_.line_no()); }

  // The next document, or false at the end of the file.
  bool next(std::string* doc) {
    doc->clear();
    std::string line;
    while (in_.next(&line, jsonl_ ? kMaxJsonlLineBytes : SIZE_MAX)) {
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
    return !jsonl_ && !doc->empty();
  }

  uint64_t bytes_read() const { return in_.bytes_read(); }

 private:
  std::string parse_jsonl(const std::string& line) const {
    const std::string where = path_ + ":" + std::to_string(in_.line_no());
    const jinja::Json j = parse_jsonl_line(line, where);
    if (!j.is_object()) throw UsageError(where + ": expected a JSON object, got " + j.type_name());
    auto it = j.find(field_);
    if (it == j.end())
      throw UsageError(where + ": no field \"" + field_ +
                       "\" (choose the text field with --field NAME)");
    if (!it->is_string())
      throw UsageError(where + ": field \"" + field_ + "\" is " + a_json_type(*it) +
                       ", expected a string");
    return it->get<std::string>();
  }

  LineReader in_;
  std::string path_;
  bool jsonl_;
  std::string field_;
};

bool is_chat_format(const std::string& format) { return format == "chat" || format == "alpaca"; }

bool is_jsonl(const std::string& path, const std::string& format) {
  if (format == "jsonl" || format == "preference" || is_chat_format(format)) return true;
  if (format == "text") return false;
  if (format != "auto")
    throw UsageError("--format must be auto, text, jsonl, chat, alpaca or preference, got " +
                     format);
  std::string ext = fs::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json";
}

// Runs encode_one(i) for i in [0, count) on `threads` workers; the first exception of any
// worker is rethrown here. With `tick`, the calling thread does no encoding but calls tick()
// every quarter second until the workers are done (progress reports).
template <class F>
void parallel_for(size_t count, int threads, F&& encode_one,
                  const std::function<void()>& tick = nullptr) {
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  std::condition_variable done_cv;
  int running = 0;
  auto work = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < count;) encode_one(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      next = count;  // stop the others early
    }
  };
  const int n = std::max(1, std::min<int>(threads, int(count)));
  std::vector<std::thread> pool;
  if (tick) {
    running = n;
    for (int t = 0; t < n; ++t)
      pool.emplace_back([&] {
        work();
        std::lock_guard<std::mutex> lock(mu);
        --running;
        done_cv.notify_all();
      });
    std::unique_lock<std::mutex> lock(mu);
    while (running > 0) {
      done_cv.wait_for(lock, std::chrono::milliseconds(250));
      if (running == 0) break;
      lock.unlock();
      tick();
      lock.lock();
    }
  } else {
    for (int t = 1; t < n; ++t) pool.emplace_back(work);
    work();
  }
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
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

// The output folder and the staging folder the shards are written into (tokenize.h).
class Output {
 public:
  explicit Output(std::string dir) {
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    dir_ = dir;
    std::error_code ec;
    const std::string pid = std::to_string(::getpid());
    existed_ = fs::exists(dir_, ec) || fs::is_symlink(dir_, ec);
    if (existed_) {
      if (!fs::is_directory(dir_, ec))
        throw UsageError("--output " + dir + ": " + file_kind(dir) + ", not a folder");
      for (const auto& e : fs::directory_iterator(dir_, ec))
        if (e.path().extension() == ".h5")
          throw UsageError(dir + " already holds shards (" + e.path().filename().string() +
                           "); remove them or choose another --output");
      staging_ = dir_ / (".ft-tokenize.tmp-" + pid);
    } else {
      fs::path parent = dir_.parent_path();
      if (parent.empty()) parent = ".";
      // The folders above that do not exist yet, made now and removed again on failure.
      std::vector<fs::path> missing;
      for (fs::path p = parent; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
        missing.push_back(p);
        if (p == p.parent_path()) break;
      }
      for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
        if (!fs::create_directory(*it, ec) && !fs::is_directory(*it))
          FT_FAIL("--output ", dir, ": cannot create the folder ", it->string(), " (", ec.message(),
                  ")");
        created_.push_back(*it);
      }
      std::string name = ".";  // (built in steps: GCC 12 warns of a false -Wrestrict otherwise)
      name += dir_.filename().string();
      name += ".tmp-";
      name += pid;
      staging_ = parent / name;
    }
    fs::remove_all(staging_, ec);
    if (!fs::create_directory(staging_, ec))
      FT_FAIL("--output ", dir, ": cannot create the folder ", staging_.string(), " (",
              ec.message().empty() ? "unknown error" : ec.message(), ")");
  }
  ~Output() { abort(); }
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;

  std::string staging_path(const std::string& name) const { return (staging_ / name).string(); }

  // Puts the shards in place: the staging folder becomes the output folder, or its shards
  // move into the one that existed. Returns their paths there.
  std::vector<std::string> commit(const std::vector<std::string>& names) {
    std::error_code ec;
    std::vector<std::string> paths;
    if (!existed_) {
      fs::rename(staging_, dir_, ec);
      if (ec)
        FT_FAIL("--output ", dir_.string(), ": cannot rename ", staging_.string(), " to it (",
                ec.message(), ")");
    } else {
      for (const std::string& n : names) {
        fs::rename(staging_ / n, dir_ / n, ec);
        if (ec)
          FT_FAIL("--output ", dir_.string(), ": cannot move ", n, " into it (", ec.message(), ")");
      }
      fs::remove_all(staging_, ec);
    }
    committed_ = true;
    for (const std::string& n : names) paths.push_back((dir_ / n).string());
    return paths;
  }

  // Removes what this run made (the staging folder, the folders it created); idempotent.
  void abort() {
    if (committed_) return;
    committed_ = true;
    std::error_code ec;
    fs::remove_all(staging_, ec);
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) fs::remove(*it, ec);
  }

 private:
  fs::path dir_, staging_;
  bool existed_ = false, committed_ = false;
  std::vector<fs::path> created_;  // outermost first
};

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
  const bool chat = is_chat_format(opt.format);
  const bool preference = opt.format == "preference";
  if (preference && opt.train_on_prompt)
    throw UsageError(
        "--train-on-prompt does not apply to --format preference: a pair's prompt is never "
        "trained on (DPO compares the completions' probabilities)");

  // Check everything cheap before the long part: inputs are files, the output holds no shards.
  uint64_t total_bytes = 0;
  for (const std::string& in : opt.inputs) {
    total_bytes += check_regular_file(in, UINT64_MAX, "--input");
    is_jsonl(in, opt.format);
  }
  Output output(opt.output_dir);  // removes what it made unless committed

  const std::unique_ptr<Tokenizer> tok_ptr = load_tokenizer(opt.tokenizer);
  const Tokenizer& tok = *tok_ptr;
  ShardAttributes attrs;
  attrs.vocab_size = tok.vocab_size();
  attrs.bos_id = tok.bos_id();
  attrs.eos_id = document_eos_id(opt.tokenizer, tok);
  attrs.tokenizer_sha256 = tok.sha256();
  ShardWriter::Options wopt;
  wopt.chunk_tokens = uint64_t(std::min<int64_t>(opt.shard_tokens, int64_t(1) << 16));
  std::unique_ptr<ChatTemplate> chat_template;
  const std::string no_spm =
      tok.path() + ": --format " + opt.format +
      " needs a Hugging Face tokenizer.json with a byte-level BPE model for message lists (a "
      "SentencePiece model does not match the special tokens a chat template writes, so "
      "Mistral's and Llama 2's tokenizers cannot make chat data yet)";
  if (chat) {
    if (fs::path(tok.path()).extension() != ".json") throw UsageError(no_spm);
    chat_template = std::make_unique<ChatTemplate>(load_chat_template(opt.tokenizer));
    wopt.loss_mask = !opt.train_on_prompt;
  }
  // Preference records of strings need no template, and those of message lists no EOS: what a
  // form lacks is an error at its first record (naming it), not before.
  std::string no_template;  // why message lists cannot be rendered, when they cannot
  if (preference) {
    attrs.preference = true;
    wopt.loss_mask = true;
    if (fs::path(tok.path()).extension() != ".json") {
      no_template = no_spm;
    } else {
      try {
        chat_template = std::make_unique<ChatTemplate>(load_chat_template(opt.tokenizer));
      } catch (const UsageError& e) {
        no_template = std::string("message lists are rendered with the chat template: ") + e.what();
      }
    }
  }
  const auto t_loaded = Clock::now();

  TokenizeSummary sum;
  sum.load_seconds = std::chrono::duration<double>(t_loaded - t0).count();
  std::vector<std::string> shard_names;
  std::unique_ptr<ShardWriter> writer;
  auto close_shard = [&] {
    if (!writer) return;
    writer->close();
    writer.reset();
  };
  // `ids` go into the current shard unless they would take it past shard_tokens (tokenize.h).
  auto open_shard_for = [&](uint64_t ids) {
    if (writer && writer->num_tokens() > 0 &&
        writer->num_tokens() + ids > uint64_t(opt.shard_tokens))
      close_shard();
    if (!writer) {
      shard_names.push_back(shard_file_name(sum.shards));
      writer = std::make_unique<ShardWriter>(output.staging_path(shard_names.back()), attrs, wopt);
      ++sum.shards;
    }
  };
  auto write_doc = [&](const std::vector<int32_t>& ids, const std::vector<uint8_t>* mask) {
    open_shard_for(ids.size());
    writer->add_document(ids, wopt.loss_mask ? mask : nullptr);
    ++sum.documents;
    sum.tokens += ids.size();
  };
  // A pair's two documents stay in one shard (documents 2k and 2k + 1 of a shard are a pair).
  auto write_pair = [&](const PreferenceTokens& p) {
    open_shard_for(p.chosen.ids.size() + p.rejected.ids.size());
    for (const ChatTokens* seq : {&p.chosen, &p.rejected}) {
      writer->add_document(seq->ids, &seq->mask);
      ++sum.documents;
      sum.tokens += seq->ids.size();
      for (uint8_t m : seq->mask) sum.trained_tokens += m;
    }
    ++sum.pairs;
  };

  // Progress (core/progress.h): bytes read of all inputs; documents and tokens done so far,
  // counted by the workers as they finish each.
  std::atomic<uint64_t> batch_docs{0}, batch_tokens{0};
  WorkProgress progress("tokenize", double(total_bytes), WorkProgress::Unit::kBytes, "",
                        opt.progress);
  uint64_t bytes_done = 0;  // of the files before this one
  const DocumentReader* reading = nullptr;
  std::string reading_path;
  // The batch being encoded: read from byte batch_from of the file up to bytes_read(), which
  // counts as read in proportion to the documents encoded, so the ETA moves as they are.
  uint64_t batch_from = 0, batch_items = 0;
  auto report = [&] {
    const double secs = progress.seconds();
    const uint64_t docs = sum.documents + batch_docs.load(),
                   toks = sum.tokens + batch_tokens.load();
    double file_done = 0;
    if (reading) {
      const double batch = double(reading->bytes_read() - batch_from);
      file_done =
          double(batch_from) +
          (batch_items > 0 ? batch * std::min(1.0, double(batch_docs.load()) / double(batch_items))
                           : batch);
    }
    progress.update(
        double(bytes_done) + file_done,
        detail::concat("file ", sum.files + 1, " of ", opt.inputs.size(), " ", reading_path, ", ",
                       preference ? human_count(double(docs / 2)) + " pairs, "
                                  : human_count(double(docs)) + " documents, ",
                       human_count(double(toks)), " tokens, ",
                       human_count(double(toks) / std::max(secs, 1e-9)), " tokens/s"));
  };
  const std::function<void()> tick =
      opt.progress ? std::function<void()>([&] { report(); }) : std::function<void()>();

  std::vector<std::string> no_trainable;  // chat input files without a token to train on
  try {
    std::vector<std::string> docs, where;
    std::vector<std::vector<int32_t>> encoded;
    std::vector<jinja::Json> convs;
    std::vector<ChatTokens> chat_encoded;
    std::vector<PreferenceRecord> prefs;
    std::vector<PreferenceTokens> pref_encoded;
    for (const std::string& in : opt.inputs) {
      DocumentReader reader(in, is_jsonl(in, opt.format), opt.field);
      reading = &reader;
      reading_path = in;
      uint64_t file_convs = 0, file_content_tokens = 0;
      bool more = true;
      while (more) {
        check_stop(opt.stop);
        docs.clear();
        convs.clear();
        where.clear();
        size_t batch_bytes = 0;
        std::string doc;
        jinja::Json conv;
        batch_docs = 0;
        batch_tokens = 0;
        batch_from = reader.bytes_read();
        if (preference) {
          const uint64_t batch_start = reader.bytes_read();
          PreferenceRecord pref;
          prefs.clear();
          while (prefs.size() < kBatchDocs && reader.bytes_read() - batch_start < kBatchBytes &&
                 (more = reader.next_preference(&pref))) {
            // What the record's form needs (a template, an EOS), refused at its first record.
            if (pref.messages && !chat_template)
              throw UsageError(reader.where() + ": " + no_template);
            if (!pref.messages && attrs.eos_id < 0)
              throw UsageError(
                  reader.where() + ": string completions end with the tokenizer's EOS, and " +
                  tok.path() +
                  " has none (no EOS after $A in its post-processor, no eos_token in "
                  "tokenizer_config.json); use a tokenizer with an EOS, or message lists "
                  "(rendered with the chat template, which ends each turn)");
            prefs.push_back(std::move(pref));
            where.push_back(reader.where());
          }
          pref_encoded.assign(prefs.size(), {});
          batch_items = 2 * prefs.size();  // batch_docs counts both documents of a pair
          parallel_for(
              prefs.size(), threads,
              [&](size_t i) {
                check_stop(opt.stop);
                try {
                  pref_encoded[i] =
                      tokenize_preference(prefs[i], tok, chat_template.get(), int32_t(attrs.bos_id),
                                          int32_t(attrs.eos_id));
                } catch (const UsageError& e) {
                  throw UsageError(where[i] + ": " + e.what());
                } catch (const Error& e) {
                  if (int(e.code()) > 128) throw;  // stopped
                  FT_FAIL(where[i], ": ", e.what());
                }
                batch_tokens +=
                    pref_encoded[i].chosen.ids.size() + pref_encoded[i].rejected.ids.size();
                batch_docs += 2;
              },
              tick);
          for (const PreferenceTokens& p : pref_encoded) write_pair(p);
        } else if (chat) {
          const uint64_t batch_start = reader.bytes_read();
          while (convs.size() < kBatchDocs && reader.bytes_read() - batch_start < kBatchBytes &&
                 (more = reader.next_conversation(opt.format == "alpaca", &conv))) {
            convs.push_back(std::move(conv));
            where.push_back(in + ":" + std::to_string(reader.line_no()));
          }
          chat_encoded.assign(convs.size(), {});
          batch_items = convs.size();
          parallel_for(
              convs.size(), threads,
              [&](size_t i) {
                check_stop(opt.stop);
                try {
                  chat_encoded[i] = tokenize_chat(*chat_template, tok, convs[i], wopt.loss_mask);
                } catch (const UsageError& e) {
                  throw UsageError(where[i] + ": " + e.what());
                } catch (const Error& e) {
                  if (int(e.code()) > 128) throw;  // stopped
                  FT_FAIL(where[i], ": ", e.what());
                }
                batch_tokens += chat_encoded[i].ids.size();
                ++batch_docs;
              },
              tick);
          for (const ChatTokens& c : chat_encoded) {
            write_doc(c.ids, &c.mask);
            if (wopt.loss_mask)
              for (uint8_t m : c.mask) sum.trained_tokens += m;
            file_content_tokens += uint64_t(c.content_tokens);
          }
          file_convs += convs.size();
        } else {
          while (docs.size() < kBatchDocs && batch_bytes < kBatchBytes &&
                 (more = reader.next(&doc))) {
            batch_bytes += doc.size();
            docs.push_back(std::move(doc));
          }
          encoded.assign(docs.size(), {});
          batch_items = docs.size();
          try {
            parallel_for(
                docs.size(), threads,
                [&](size_t i) {
                  check_stop(opt.stop);
                  std::vector<int32_t> ids = tok.encode(docs[i]);
                  std::vector<int32_t>& d = encoded[i];
                  d.reserve(ids.size() + 2);
                  if (attrs.bos_id >= 0) d.push_back(attrs.bos_id);
                  d.insert(d.end(), ids.begin(), ids.end());
                  if (attrs.eos_id >= 0) d.push_back(attrs.eos_id);
                  batch_tokens += d.size();
                  ++batch_docs;
                },
                tick);
          } catch (const Error& e) {
            if (int(e.code()) > 128) throw;
            FT_FAIL(in, ": ", e.what());
          }
          for (const auto& ids : encoded) write_doc(ids, nullptr);
        }
        batch_docs = 0;
        batch_tokens = 0;
        batch_items = 0;
        report();
      }
      bytes_done += reader.bytes_read();
      reading = nullptr;
      ++sum.files;
      if (chat && wopt.loss_mask && file_convs > 0 && file_content_tokens == 0)
        no_trainable.push_back(in + " (" + std::to_string(file_convs) + " conversation" +
                               (file_convs == 1 ? "" : "s") + ")");
    }
    check_stop(opt.stop);
    close_shard();
    if (sum.documents == 0)
      throw UsageError("no documents in the input files (empty, or only blank lines)");
    if (!no_trainable.empty()) {
      std::string files;
      for (const std::string& f : no_trainable) files += (files.empty() ? "" : ", ") + f;
      const std::string what =
          "no token to train on in " + files +
          ": no assistant message has content, so their loss_mask is 0 but for end-of-turn "
          "tokens (check the roles: assistant, or gpt in ShareGPT's conversations)";
      if (!opt.allow_no_trainable)
        throw UsageError(what +
                         "; --train-on-prompt trains on every token, --allow-no-trainable "
                         "keeps such files as they are");
      log_warn("tokenize: ", what, " (kept: --allow-no-trainable)");
    }
    sum.shard_paths = output.commit(shard_names);
    progress.close();  // the caller prints the summary
  } catch (...) {
    writer.reset();  // deletes its .tmp file
    output.abort();  // and the staging folder, with any folder this run created
    throw;
  }
  sum.seconds = std::chrono::duration<double>(Clock::now() - t_loaded).count();
  return sum;
}

}  // namespace ft
