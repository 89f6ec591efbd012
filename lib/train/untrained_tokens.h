// The start-up check of an adapter run for an end-of-turn token the base never trained
// (DESIGN.md §5 Adapters): a base model ships its chat template's end-of-turn token (Qwen2's
// <|im_end|>, Llama 3's <|eot_id|>) with the embedding and output rows it was initialised with,
// or zeros, and LoRA on the frozen base cannot move them: the model then learns to answer but
// never to stop. Unsloth checks for the same rows (all ~0 in both matrices); ft names the remedy,
// adapter.modules_to_save: [embed_tokens, lm_head].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace ft {

// The criterion: a row looks untrained when its L2 norm is below this fraction of the median row
// norm of its matrix (an all-zero row, the common case, is far below; trained rows of rare
// tokens stay within a few times the median).
constexpr double kUntrainedNormRatio = 0.1;

// The median of the L2 norms of `n` rows of `cols` values (row-major); 0 for none.
double median_row_norm(const float* rows, size_t n, int64_t cols);

// What ft train prints, one warning each (empty: nothing looks untrained, or nothing to check):
// for an adapter run on model.from whose adapter trains neither row, each end-of-turn token of
// the chat template (tokenizer.path's, else model.from's folder; data/chat.h end_of_turn_ids)
// whose row of model.embed_tokens.weight or lm_head.weight (when not tied and not trained) looks
// untrained: the token, its id, its row's norm against the median's (of up to kSampledRows rows
// spread over the vocabulary), and the option. A folder without a chat template or tokenizer,
// or one ft cannot read, is nothing to check here (the run reads what it needs elsewhere).
constexpr int64_t kSampledRows = 4096;
std::vector<std::string> untrained_token_warnings(const Recipe& r);

}  // namespace ft
