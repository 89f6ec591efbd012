// ft tokenize: text / JSONL files -> HDF5 token shards (DESIGN.md §6). The work is in
// lib/data/tokenize.cpp; this file maps arguments and prints the summary.
#include <cstdio>

#include "apps/ft/commands.h"
#include "data/tokenize.h"

namespace ft::app {

int cmd_tokenize(const TokenizeArgs& a) {
  TokenizeOptions opt;
  opt.tokenizer = a.tokenizer;
  opt.inputs = a.inputs;
  opt.output_dir = a.output;
  opt.format = a.format;
  opt.field = a.field;
  opt.train_on_prompt = a.train_on_prompt;
  opt.shard_tokens = a.shard_tokens;
  opt.threads = a.threads;
  TokenizeSummary s = tokenize_to_shards(opt);
  std::printf(
      "tokenized %d file%s: %llu documents, %llu tokens -> %d shard%s in %s (%.1f s, %.0f "
      "tokens/s)\n",
      s.files, s.files == 1 ? "" : "s", (unsigned long long)s.documents,
      (unsigned long long)s.tokens, s.shards, s.shards == 1 ? "" : "s", a.output.c_str(), s.seconds,
      s.seconds > 0 ? double(s.tokens) / s.seconds : 0.0);
  return 0;
}

}  // namespace ft::app
