// Preference pairs for DPO (DESIGN.md §6 "Preference data"): a JSONL record {prompt, chosen,
// rejected} becomes a pair of token sequences, chosen and rejected, each the prompt followed by
// its completion, with a loss_mask that is 1 on the completion's tokens only. `ft tokenize
// --format preference` writes them as documents 2k and 2k + 1 of ft-preference shards
// (shard.h); the loader cuts or drops what does not fit data.seq_len, so nothing here looks at
// lengths.
//
// The forms of a record (one form for the whole record: a mix is an input error):
//   text      prompt, chosen and rejected are strings. The prompt is BOS (where the tokenizer
//             has one) + encode(prompt), without EOS; each completion is encode(completion)
//             alone, without BOS, followed by EOS (as TRL's DPOTrainer tokenizes them). Encoding
//             the parts apart means both sequences start with exactly the same prompt tokens,
//             whatever merges the tokenizer would make across the boundary.
//   messages  prompt is a list of messages; chosen and rejected each a list of one assistant
//             message (TRL's conversational form). Each sequence is the conversation prompt +
//             [completion], rendered with the chat template and tokenized as --format chat does
//             (chat.h: the template writes its own special tokens, so the tokens equal
//             transformers' apply_chat_template(prompt + completion, tokenize=True)); its mask
//             is the chat mask of that last message alone (its content and end-of-turn token).
//             Assistant turns inside the prompt are not trained on.
//   implicit  no prompt: chosen and rejected are whole conversations; the prompt is their
//             longest common prefix of messages (equal role and content), and what follows it
//             in each must be exactly one assistant message. Then as `messages`.
// Message lists are read as --format chat reads `messages` ({role, content}) or, when a list's
// first message has `from` and no `role`, ShareGPT's `conversations` ({from, value}).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/chat.h"
#include "data/jinja.h"
#include "data/tokenizer.h"

namespace ft {

class ShardSet;  // data/shard.h

struct PreferenceRecord {
  bool messages = false;  // a message-list form (explicit or implicit prompt), else text
  // text: the three strings
  std::string prompt, chosen, rejected;
  // messages: each sequence's whole conversation, the prompt's messages + its completion
  jinja::Json chosen_conversation, rejected_conversation;
};

// One JSONL record (a JSON object) as a preference record, checked: the keys are there, the
// whole record is in one form, the contents are strings, each completion is one assistant
// message. Throws UsageError naming `where` (file:line), the key and what would fix it.
PreferenceRecord preference_from_record(const jinja::Json& record, const std::string& where);

struct PreferenceTokens {
  ChatTokens chosen, rejected;  // ids and mask of each sequence (prompt + completion)
};

// The pair's sequences. Text records take `bos_id` (-1: none) and `eos_id` (>= 0: the caller
// refuses a tokenizer without one), message records `chat` (not null). Throws UsageError, naming
// the key but not the record (the caller does), when the template raises or renders no token of
// a completion to train on.
PreferenceTokens tokenize_preference(const PreferenceRecord& record, const Tokenizer& tok,
                                     const ChatTemplate* chat, int32_t bos_id, int32_t eos_id);

// Lengths in tokens over a shard folder's pairs, for `ft inspect`.
struct LengthStats {
  uint64_t count = 0, min = 0, max = 0, sum = 0;
  void add(uint64_t n);
  double mean() const { return count ? double(sum) / double(count) : 0.0; }
};
struct PreferenceLengths {
  uint64_t pairs = 0;
  // A sequence's prompt is its mask-0 prefix, its completion the tokens from its first trained
  // one to its end. A pair's prompt is its chosen sequence's.
  LengthStats prompt, chosen, rejected;
  // Pairs whose two sequences start with different prompts (message lists whose template
  // renders the prompt differently before each completion); 0 for what ft tokenize writes from
  // text records.
  uint64_t prompts_differ = 0;
};
// Reads every pair's tokens and mask (a preference folder: ShardAttributes::preference).
PreferenceLengths preference_lengths(ShardSet& set);

}  // namespace ft
