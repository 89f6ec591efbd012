// ft tokenize: text / JSONL files -> HDF5 token shards (DESIGN.md §6). The work is in
// lib/data/tokenize.cpp; this file maps arguments, turns SIGINT/SIGTERM into the library's stop
// flag (it then removes what it wrote: exit 130 / 143) and prints the summary.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "apps/ft/commands.h"
#include "core/error.h"
#include "data/tokenize.h"

namespace ft::app {
namespace {

std::atomic<int> g_stop{0};  // the signal that asked tokenize to stop (lock-free: signal-safe)
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) { g_stop.store(sig); }

// SIGINT and SIGTERM set g_stop while it lives; the previous handlers come back after.
class StopOnSignals {
 public:
  StopOnSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopOnSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

}  // namespace

int cmd_tokenize(const TokenizeArgs& a) {
  TokenizeOptions opt;
  opt.tokenizer = a.tokenizer;
  opt.inputs = a.inputs;
  opt.output_dir = a.output;
  opt.format = a.format;
  // --field names the text of a JSONL document; the other formats' records have fixed keys, and
  // a field given with them would be ignored without a word.
  if (!a.field.empty() && a.format != "auto" && a.format != "jsonl")
    throw UsageError("--field " + a.field +
                     " applies to JSONL documents (--format jsonl, or "
                     "auto with .jsonl/.json inputs); --format " +
                     a.format + " reads " +
                     (a.format == "text" ? std::string("plain text")
                                         : "records with fixed keys (ft tokenize --help)") +
                     ": drop --field");
  opt.field = a.field.empty() ? "text" : a.field;
  opt.train_on_prompt = a.train_on_prompt;
  opt.allow_no_trainable = a.allow_no_trainable;
  opt.shard_tokens = a.shard_tokens;
  opt.threads = a.threads;
  opt.stop = &g_stop;
  TokenizeSummary s;
  {
    StopOnSignals stop_on_signals;
    s = tokenize_to_shards(opt);
  }
  // A preference run counts pairs (each two documents, chosen and rejected).
  const std::string what = a.format == "preference"
                               ? std::to_string(s.pairs) + (s.pairs == 1 ? " pair" : " pairs") +
                                     " (" + std::to_string(s.documents) + " documents)"
                               : std::to_string(s.documents) + " documents";
  std::printf(
      "tokenized %d file%s: %s, %llu tokens -> %d shard%s in %s (loading %.2f s, tokenizing "
      "%.2f s: %.0f tokens/s)\n",
      s.files, s.files == 1 ? "" : "s", what.c_str(), (unsigned long long)s.tokens, s.shards,
      s.shards == 1 ? "" : "s", a.output.c_str(), s.load_seconds, s.seconds,
      s.seconds > 0 ? double(s.tokens) / s.seconds : 0.0);
  return 0;
}

}  // namespace ft::app
