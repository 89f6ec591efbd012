#include "train/untrained_tokens.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>

#include "ckpt/hf.h"
#include "core/error.h"
#include "data/chat.h"
#include "data/tokenizer.h"

namespace ft {

double median_row_norm(const float* rows, size_t n, int64_t cols) {
  if (n == 0) return 0;
  std::vector<double> norms(n);
  for (size_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t c = 0; c < cols; ++c)
      s += double(rows[i * size_t(cols) + size_t(c)]) * double(rows[i * size_t(cols) + size_t(c)]);
    norms[i] = std::sqrt(s);
  }
  std::sort(norms.begin(), norms.end());
  return n % 2 ? norms[n / 2] : 0.5 * (norms[n / 2 - 1] + norms[n / 2]);
}

std::vector<std::string> untrained_token_warnings(const Recipe& r) {
  const AdapterConfig& a = r.adapter;
  const ModelConfig& m = r.model;
  if (!a.enabled() || m.from.empty()) return {};
  // The rows the adapter leaves as the base has them: with tied embeddings one table, which any
  // modules_to_save trains.
  std::vector<std::string> matrices;
  if (m.tie_embeddings ? a.modules_to_save.empty() : !a.saves("embed_tokens"))
    matrices.push_back("model.embed_tokens.weight");
  if (!m.tie_embeddings && !a.saves("lm_head")) matrices.push_back("lm_head.weight");
  if (matrices.empty()) return {};

  std::set<int32_t> turn;
  std::unique_ptr<Tokenizer> tok;
  try {
    const std::string path = r.tokenizer.path.empty() ? m.from : r.tokenizer.path;
    tok = load_tokenizer(path);
    turn = end_of_turn_ids(load_chat_template(path), *tok);
  } catch (const Error&) {
    return {};  // no tokenizer or chat template there: no end of turn to check
  }
  std::vector<int64_t> ids;
  for (int32_t id : turn)
    if (id >= 0 && id < m.vocab_size) ids.push_back(id);
  if (ids.empty()) return {};

  // The median over rows spread evenly over the vocabulary (all of a small one), then each
  // end-of-turn row against it.
  const int64_t V = m.vocab_size, k = std::min(V, kSampledRows);
  std::vector<int64_t> sample;
  for (int64_t i = 0; i < k; ++i) sample.push_back(i * V / k);
  std::vector<std::string> rows_said(ids.size());  // per token: its untrained-looking rows
  for (const std::string& name : matrices) {
    int64_t cols = 0;
    const std::vector<float> spread = read_hf_rows(m.from, name, sample, &cols);
    const double median = median_row_norm(spread.data(), sample.size(), cols);
    const std::vector<float> rows = read_hf_rows(m.from, name, ids, &cols);
    for (size_t i = 0; i < ids.size(); ++i) {
      const double norm = median_row_norm(rows.data() + i * size_t(cols), 1, cols);
      if (!(norm < kUntrainedNormRatio * median)) continue;
      char figures[160];
      std::snprintf(figures, sizeof figures, "norm %.3g, %.3g of the median row's %.3g", norm,
                    median > 0 ? norm / median : 0.0, median);
      rows_said[i] += (rows_said[i].empty() ? "" : "; ") + name + ": " + figures;
    }
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < ids.size(); ++i)
    if (!rows_said[i].empty())
      out.push_back(detail::concat(
          "the chat template's end-of-turn token ", tok->decode({int32_t(ids[i])}), " (id ", ids[i],
          ") looks untrained in model.from (", rows_said[i], "; a row below ", kUntrainedNormRatio,
          " of the median counts as untrained): LoRA on the frozen base cannot train it, and "
          "the model may never end its turn; train its rows with adapter.modules_to_save: "
          "[embed_tokens, lm_head]"));
  return out;
}

}  // namespace ft
