// Text / JSONL files -> a folder of ft-tokens shards (the library side of `ft tokenize`).
//
// Documents:
//   text   a document is a block of lines separated by one or more blank (whitespace-only)
//          lines; its text is its lines joined with "\n" (a trailing "\r" is dropped from each
//          line, so CRLF files give the same tokens as LF files).
//   jsonl  every non-blank line is one JSON object whose string field `field` is the
//          document; a line that is not JSON, not an object, or lacks the field is an error
//          naming file:line.
//   chat   every non-blank line is one conversation: `messages` or ShareGPT `conversations`
//   alpaca every non-blank line is instruction/input/output (both: chat.h)
//   preference  every non-blank line is a pair: prompt, chosen, rejected (preference.h)
// Each text/jsonl document becomes BOS + encode(text) + EOS; a tokenizer without BOS (or EOS)
// id, i.e. -1, gets none, and the shard records -1 in bos_id (eos_id). A chat or alpaca
// document is the conversation rendered with the tokenizer folder's chat template and
// tokenized as is (the template writes its own special tokens), with a loss_mask marking the
// assistant's tokens (chat.h) unless train_on_prompt. A preference record is two documents,
// chosen then rejected (each prompt + completion), with the loss_mask of preference.h, in
// ft-preference shards.
//
// Shards: documents never span shards, so every shard is self-contained (doc_offsets[0] = 0
// and each offset starts a whole document). A shard is closed when the next document would
// take it past `shard_tokens`; a single document longer than that gets a shard of its own. A
// preference pair is placed as one document would be (its two documents stay together).
// Files are named shard_00000.h5, shard_00001.h5, ... (sortable).
//
// The output appears whole or not at all: shards are written into a hidden staging folder
// (`.NAME.tmp-PID` beside output_dir when it does not exist yet, renamed to it at the end;
// `output_dir/.ft-tokenize.tmp-PID` when it does, its shards moved up at the end). On any error,
// and when `stop` is set (SIGINT, SIGTERM), the staging folder is removed, and so is every
// folder this run created; a folder that existed is left as it was. Only a run killed outright
// (SIGKILL) leaves its staging folder behind, which no reader takes for shards.
//
// Inputs are bounded: a JSONL line (jsonl, chat, alpaca) longer than kMaxJsonlLineBytes is an
// error naming file:line, read no further; invalid UTF-8 becomes U+FFFD (chat.h
// parse_jsonl_line; text documents: the tokenizer does the same).
//
// Chat data: every input file must give some token to train on (a token of an assistant
// message's content; the end-of-turn tokens alone do not count): a file whose conversations
// have no assistant message, or only empty ones, would add nothing but padding to training,
// which is usually a mistake (prompts meant for --train-on-prompt, roles named otherwise).
// Judged per file, since a file is what the user can fix; all such files are named at the end
// (UsageError), or warned about with allow_no_trainable.
//
// Parallelism: documents are read in batches on the calling thread, encoded by `threads`
// workers, and written in input order, so the output is identical for any thread count. With
// progress, the calling thread reports every few seconds while the workers encode, so that a
// batch of long conversations does not go silent.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace ft {

struct TokenizeOptions {
  std::string tokenizer;            // .model, tokenizer.json or HF folder (load_tokenizer)
  std::vector<std::string> inputs;  // files, in order
  std::string output_dir;           // created if missing; must not already hold *.h5
  // auto (by extension: .jsonl/.json -> jsonl) | text | jsonl | chat | alpaca | preference
  std::string format = "auto";
  std::string field = "text";    // JSONL field
  bool train_on_prompt = false;  // chat/alpaca: no loss_mask (every token is trained on);
                                 // refused with preference
  int64_t shard_tokens = 16 * 1024 * 1024;
  int threads = 0;                  // 0: all cores
  bool progress = true;             // progress lines on stderr every few seconds
  bool allow_no_trainable = false;  // chat/alpaca: a file with no token to train on is a warning
  // When it becomes non-zero (a signal's number, set by a handler), the run stops at the next
  // document, removes what it wrote and throws Error with exit code 128 + that number.
  const std::atomic<int>* stop = nullptr;
};

struct TokenizeSummary {
  int files = 0;
  uint64_t documents = 0;
  uint64_t tokens = 0;
  int shards = 0;
  uint64_t pairs = 0;                    // preference: pairs (documents / 2)
  uint64_t trained_tokens = 0;           // with masks: tokens with loss_mask 1
  double load_seconds = 0;               // loading the tokenizer and the chat template
  double seconds = 0;                    // the rest: reading, encoding and writing
  std::vector<std::string> shard_paths;  // in output_dir
};

TokenizeSummary tokenize_to_shards(const TokenizeOptions& opt);

// Name of shard i in a folder: shard_%05d.h5. Names must sort in write order, so more than
// 100000 shards is an error (raise --shard-tokens instead).
std::string shard_file_name(int64_t index);

}  // namespace ft
