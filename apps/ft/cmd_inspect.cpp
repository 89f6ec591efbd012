// ft inspect PATH: says what a folder holds. It recognises the folder kind first and then
// hands it to that kind's summary, so checkpoints and Hugging Face folders slot in beside
// shard folders.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "apps/ft/checkpoint_source.h"
#include "apps/ft/commands.h"
#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "core/error.h"
#include "core/files.h"
#include "data/chat.h"
#include "data/loader.h"
#include "data/preference.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "model/layout.h"
#include "model/rope.h"
#include "train/metrics.h"

namespace ft::app {
namespace {

// Tensor tables print the first layer of a run of identical layers and fold the rest into one
// line.
void print_folded_layers(int from, int to) {
  if (from == to)
    std::printf("    ... 1 more layer with the same tensors (layer %d)\n", from);
  else
    std::printf("    ... %d more layers with the same tensors (layers %d-%d)\n", to - from + 1,
                from, to);
}

namespace fs = std::filesystem;

enum class FolderKind { kShards, kCheckpoint, kHuggingFace, kUnknown };

bool has_file_with_extension(const fs::path& dir, const std::string& ext) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ext) return true;
  return false;
}

// DESIGN.md §6 and §8 tell the kinds apart: *.h5 shards; a checkpoint step folder
// (manifest.json) or checkpoint root (latest, or step_* folders); an HF folder (config.json).
FolderKind classify(const fs::path& dir) {
  std::error_code ec;
  if (has_file_with_extension(dir, ".h5")) return FolderKind::kShards;
  if (fs::exists(dir / "manifest.json", ec) || ckpt::has_checkpoints(dir.string()))
    return FolderKind::kCheckpoint;
  if (fs::exists(dir / "config.json", ec)) return FolderKind::kHuggingFace;
  return FolderKind::kUnknown;
}

// The packing data.pack would make (loader.h), and how much of the windows it fills.
void print_packing(ShardSet& set, int seq_len, const std::string& overflow) {
  const PackingStats st = packing_stats(set, seq_len, overflow == "split");
  std::printf("  packing at seq_len %d (data.pack: true, data.pack_overflow: %s):\n", seq_len,
              overflow.c_str());
  std::printf("    windows:        %llu (samples per epoch)\n", (unsigned long long)st.windows);
  std::printf("    efficiency:     %.2f%% (%llu of %llu window positions hold document tokens)\n",
              100.0 * st.efficiency(), (unsigned long long)st.filled,
              (unsigned long long)st.positions);
  std::printf("    pieces:         %llu from %llu documents\n", (unsigned long long)st.pieces,
              (unsigned long long)st.documents);
  if (st.short_documents > 0)
    std::printf("    skipped:        %llu document%s of fewer than 2 tokens (no target)\n",
                (unsigned long long)st.short_documents, st.short_documents == 1 ? "" : "s");
  if (st.long_documents > 0)
    std::printf("    longer than a window: %llu document%s, %s\n",
                (unsigned long long)st.long_documents, st.long_documents == 1 ? "" : "s",
                overflow == "split"
                    ? "split into pieces"
                    : detail::concat("dropped (", st.dropped_tokens, " tokens)").c_str());
}

// A preference folder's pairs (DESIGN.md §6 "Preference data") and their lengths.
void print_preference(ShardSet& set) {
  const PreferenceLengths st = preference_lengths(set);
  std::printf("  pairs:            %llu (documents 2k and 2k+1: chosen, rejected)\n",
              (unsigned long long)st.pairs);
  std::printf("  lengths (tokens):        min      mean       max\n");
  using Row = std::pair<const char*, const LengthStats*>;
  for (const auto& [name, l] : {Row{"prompt", &st.prompt}, Row{"chosen completion", &st.chosen},
                                Row{"rejected completion", &st.rejected}})
    std::printf("    %-20s %8llu %9.1f %9llu\n", name, (unsigned long long)l->min, l->mean(),
                (unsigned long long)l->max);
  std::printf(
      "    (a prompt: the tokens before a sequence's first trained one; a completion: the rest)\n");
  if (st.prompts_differ > 0)
    std::printf(
        "  note: %llu pair%s whose chosen and rejected sequences start with different prompts "
        "(the template renders the prompt otherwise before each completion); a pair's prompt "
        "above is its chosen sequence's\n",
        (unsigned long long)st.prompts_differ, st.prompts_differ == 1 ? "" : "s");
}

// What the DPO loader makes of the pairs at data.seq_len (loader.h "Preference pairs"): each
// sequence is a row of its own, never packed, so the length only cuts and drops.
void print_preference_windows(ShardSet& set, int seq_len) {
  const PreferenceStats st = preference_stats(set, seq_len);
  std::printf("  pairs at seq_len %d (training.objective: dpo):\n", seq_len);
  std::printf("    kept:           %llu of %llu\n", (unsigned long long)st.kept(),
              (unsigned long long)st.pairs);
  std::printf(
      "    cut:            %llu (kept, a sequence cut to its first %lld tokens: its completion "
      "loses its end)\n",
      (unsigned long long)st.cut, (long long)seq_len + 1);
  std::printf(
      "    dropped:        %llu (a sequence with no trained target in its first %d positions: "
      "the prompt fills them; or one of fewer than 2 tokens)\n",
      (unsigned long long)st.dropped, seq_len);
}

int inspect_shards(const std::string& dir, int seq_len, const std::string& overflow) {
  ShardSet set(dir);  // validates every shard; errors name the file
  const auto& shards = set.shards();
  const ShardAttributes& a = set.attrs();
  int with_mask = 0;
  for (const ShardInfo& s : shards) with_mask += s.has_loss_mask;
  std::printf("shard folder %s%s\n", dir.c_str(),
              a.preference ? " (preference pairs, format ft-preference)" : "");
  std::printf("  files:            %zu\n", shards.size());
  std::printf("  tokens:           %llu\n", (unsigned long long)set.total_tokens());
  std::printf("  documents:        %llu\n", (unsigned long long)set.total_documents());
  std::printf("  vocab_size:       %lld\n", (long long)a.vocab_size);
  std::printf("  token dtype:      uint%d\n", 8 * shards.front().token_bytes);
  std::printf("  bos_id:           %lld\n", (long long)a.bos_id);
  std::printf("  eos_id:           %lld\n", (long long)a.eos_id);
  std::printf("  tokenizer_sha256: %s\n", a.tokenizer_sha256.c_str());
  if (with_mask == 0)
    std::printf("  loss_mask:        no\n");
  else if (with_mask == int(shards.size()))
    std::printf("  loss_mask:        yes\n");
  else
    std::printf("  loss_mask:        in %d of %zu files\n", with_mask, shards.size());
  std::printf("  %-24s %14s %12s %s\n", "file", "tokens", "documents", "loss_mask");
  for (const ShardInfo& s : shards)
    std::printf("  %-24s %14llu %12llu %s\n", fs::path(s.path).filename().c_str(),
                (unsigned long long)s.num_tokens, (unsigned long long)s.num_documents,
                s.has_loss_mask ? "yes" : "no");
  if (a.preference) {
    print_preference(set);
    if (seq_len > 0) print_preference_windows(set, seq_len);
  } else if (seq_len > 0) {
    print_packing(set, seq_len, overflow);
  }
  // Leftovers of an interrupted `ft tokenize` are ignored by readers, but worth knowing about.
  int partial = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) partial += e.path().extension() == ".tmp";
  if (partial > 0)
    std::printf(
        "  note: %d unfinished *.tmp file%s (an interrupted ft tokenize?); they are ignored\n",
        partial, partial == 1 ? "" : "s");
  return 0;
}

// 1234567 → "1.23M": the size people quote for a model.
std::string short_count(uint64_t n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  double v = double(n);
  int u = 0;
  while (u < 4 && v >= 999.995) {  // what %.2f would print as 1000.00 moves up a unit
    v /= 1000.0;
    ++u;
  }
  if (u == 0) return std::to_string(n);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%s", v, units[u]);
  return buf;
}

// 1234567 → "1,234,567": the exact number, still readable.
std::string grouped(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// What makes two layers "the same" in the tensor table: names after the layer prefix, dtypes
// and shapes (not files: a layer may straddle two shards).
using LayerSignature = std::vector<std::tuple<std::string, DType, std::vector<int64_t>>>;

LayerSignature signature(const std::vector<const HfTensorInfo*>& layer_tensors) {
  LayerSignature sig;
  for (const HfTensorInfo* t : layer_tensors) {
    const size_t dot = t->name.find('.', std::string("model.layers.").size());
    sig.emplace_back(t->name.substr(dot), t->dtype, t->shape);
  }
  return sig;
}

// "rope_theta 500000", then the scaling when there is one: ", rope llama3 (factor 8, ...)".
std::string rope_text(const ModelConfig& m) {
  char theta[64];
  std::snprintf(theta, sizeof theta, "rope_theta %.10g", m.rope_theta);
  return theta + (m.rope_type == "default" ? std::string() : ", rope " + rope_description(m));
}

// Prints up to kListed problems of one kind ("missing: NAME", or a whole message when `what` is
// empty), then how many more there are.
void print_problems(const std::string& what, const std::vector<std::string>& items) {
  constexpr size_t kListed = 10;  // enough to see the pattern; a wrong layer count lists hundreds
  const std::string label = what.empty() ? "" : what + ": ";
  for (size_t i = 0; i < items.size() && i < kListed; ++i)
    std::printf("    %s%s\n", label.c_str(), items[i].c_str());
  if (items.size() > kListed)
    std::printf("    %s... and %zu more\n", label.c_str(), items.size() - kListed);
}

// There in some form (a FIFO or a dangling link too, which the readers then refuse by name).
bool is_there(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

// A token for a line of the summary: its text (an excerpt) and id.
std::string token_text(const Tokenizer& tok, int32_t id) {
  if (id < 0) return "none";
  const std::string text = tok.decode({id});
  return text.empty() ? "id " + std::to_string(id)
                      : excerpt(text, 30) + " (id " + std::to_string(id) + ")";
}

// What a Hugging Face folder offers besides its weights: a tokenizer ft reads, and a chat
// template ft's Jinja subset renders (DESIGN.md §6 Chat data). Printed as two lines; `chat`
// says whether chat data works with the folder alone, `without` what works without what is
// missing (empty when nothing is).
struct TextSupport {
  bool tokenizer = false, chat = false;
  bool template_renders = false;  // ft's Jinja subset renders the folder's chat template
  std::string missing;            // "no tokenizer", "no chat template", ...
};

TextSupport print_text_support(const std::string& dir, const ModelConfig& m) {
  TextSupport r;
  std::unique_ptr<Tokenizer> tok;
  const bool has_tok =
      is_there(fs::path(dir) / "tokenizer.json") || is_there(fs::path(dir) / "tokenizer.model");
  std::vector<std::string> missing;
  if (!has_tok) {
    std::printf("  tokenizer:     none (no tokenizer.json or tokenizer.model)\n");
    missing.push_back("no tokenizer");
  } else {
    try {
      tok = load_tokenizer(dir);
    } catch (const Error& e) {
      std::printf("  tokenizer:     ft cannot read it: %s\n", e.what());
      missing.push_back("no tokenizer ft reads");
    }
  }
  if (tok) {
    const std::string file = fs::path(tok->path()).filename().string();
    std::printf("  tokenizer:     %s (%s), %lld ids, BOS %s, EOS %s", file.c_str(),
                file == "tokenizer.json" ? "byte-level BPE" : "SentencePiece",
                (long long)tok->vocab_size(), token_text(*tok, tok->bos_id()).c_str(),
                token_text(*tok, tok->eos_id()).c_str());
    if (tok->vocab_size() > m.vocab_size) {
      std::printf(": more ids than the model's vocab_size %d, so ft refuses the pair\n",
                  m.vocab_size);
      missing.push_back("a tokenizer of more ids than the model has");
      tok.reset();
    } else {
      std::printf("\n");
      r.tokenizer = true;
    }
  }

  // The template: chat_template.jinja, or tokenizer_config.json's chat_template key. Both files
  // are checked before anything reads them (a FIFO would block the reader).
  bool has_template = is_there(fs::path(dir) / "chat_template.jinja");
  std::string unreadable;
  for (const char* name : {"tokenizer_config.json", "chat_template.jinja"}) {
    const fs::path p = fs::path(dir) / name;
    if (!unreadable.empty() || !is_there(p)) continue;
    try {
      // As data/chat.cpp reads them, in its words.
      const bool jinja = std::string(name) == "chat_template.jinja";
      check_regular_file(p.string(), jinja ? kMaxTemplateBytes : kMaxConfigBytes,
                         jinja ? "chat template" : "tokenizer config");
    } catch (const Error& e) {
      unreadable = e.what();
    }
  }
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  if (unreadable.empty() && !has_template && is_there(config)) {
    try {
      const nlohmann::json j = nlohmann::json::parse(
          read_bounded_file(config.string(), kMaxConfigBytes, "tokenizer config"));
      has_template = j.is_object() && j.contains("chat_template");
    } catch (const std::exception&) {
      has_template = true;  // load_chat_template below says what is wrong with the file
    }
  }
  if (!unreadable.empty()) {
    std::printf("  chat template: ft cannot use it: %s\n", unreadable.c_str());
    missing.push_back("no chat template ft reads");
  } else if (!has_template) {
    std::printf(
        "  chat template: none (no chat_template.jinja, and no chat_template in "
        "tokenizer_config.json)\n");
    missing.push_back("no chat template");
  } else {
    try {
      const ChatTemplate t = load_chat_template(dir);
      // The renderings chat data makes (a user turn and an assistant's reply, with and without
      // the generation prompt), so that a template outside ft's subset is found here rather
      // than at ft tokenize's first conversation.
      nlohmann::json messages = nlohmann::json::array();
      messages.push_back({{"role", "user"}, {"content", "Hi"}});
      render_chat(t, messages, true);
      messages.push_back({{"role", "assistant"}, {"content", "Hello"}});
      render_chat(t, messages, false);
      // With the tokenizer: the loss mask (data/chat.h), which needs the tokens to spell the
      // rendered text, and the end-of-turn tokens it trains on.
      std::string turn, mask_problem;
      if (tok) {
        try {
          for (int32_t id : end_of_turn_ids(t, *tok))
            turn += (turn.empty() ? "" : ", ") + token_text(*tok, id);
        } catch (const Error& e) {
          mask_problem = e.what();
        }
      }
      // "tokenizer_config.json's chat_template" or "chat_template.jinja", without the folder.
      std::string source = fs::path(t.source).filename().string();
      if (const size_t colon = source.find(": "); colon != std::string::npos)
        source = source.substr(0, colon) + "'s " + source.substr(colon + 2);
      r.template_renders = true;
      std::printf("  chat template: %s: ft's Jinja subset renders it%s\n", source.c_str(),
                  !tok || !mask_problem.empty() ? ""
                  : turn.empty() ? "; no end-of-turn token (ft generate --chat stops at EOS)"
                                 : ("; end of turn " + turn).c_str());
      if (!mask_problem.empty()) {
        std::printf("  chat tokens:   ft cannot mark the assistant's tokens: %s\n",
                    mask_problem.c_str());
        missing.push_back("the tokenizer cannot mark the assistant's tokens");
      } else {
        r.chat = true;
      }
    } catch (const Error& e) {
      std::printf("  chat template: ft cannot use it: %s\n", e.what());
      missing.push_back("no chat template ft renders");
    }
  }
  r.chat = r.chat && r.tokenizer;
  for (const std::string& x : missing) r.missing += (r.missing.empty() ? "" : ", ") + x;
  return r;
}

// Exit code 1 when ft could not use the folder as model.from, so that a script can test with
// `ft inspect DIR`; the summary is printed first either way, since it shows what is wrong.
// The tokenizer and chat template are reported (what works without them too) but do not change
// the exit code: a folder of weights alone is a valid model.from.
int inspect_hf(const std::string& dir) {
  const HfFolderSummary s = summarize_hf_folder(dir);  // malformed files throw, naming the file
  const ModelConfig& m = s.config;
  std::printf("Hugging Face folder %s\n", dir.c_str());
  std::string head_dim = heads_whole(m) ? std::to_string(head_dim_of(m)) : "-";
  std::printf(
      "  architecture: %s, dim %d, %d layer%s, %d head%s, %d kv head%s, head_dim %s, ffn %d, "
      "vocab %d, max_seq_len %d, %s, %s embeddings\n",
      m.arch.c_str(), m.dim, m.n_layers, m.n_layers == 1 ? "" : "s", m.n_heads,
      m.n_heads == 1 ? "" : "s", m.n_kv_heads, m.n_kv_heads == 1 ? "" : "s", head_dim.c_str(),
      m.ffn_dim, m.vocab_size, m.max_seq_len, rope_text(m).c_str(),
      m.tie_embeddings ? "tied" : "untied");

  uint64_t file_bytes = 0;
  size_t name_width = 0;
  for (const HfFileInfo& f : s.files) {
    file_bytes += f.bytes;
    name_width = std::max(name_width, f.name.size());
  }
  std::printf("  files:        %zu (%s)\n", s.files.size(),
              Progress::human_bytes(double(file_bytes)).c_str());
  for (const HfFileInfo& f : s.files)
    std::printf("    %-*s %10s  %zu tensor%s\n", int(name_width), f.name.c_str(),
                Progress::human_bytes(double(f.bytes)).c_str(), f.tensors,
                f.tensors == 1 ? "" : "s");
  std::printf("  parameters:   %s (%s)\n", short_count(s.parameters).c_str(),
              grouped(s.parameters).c_str());
  std::printf("  bytes:        %s of tensor data (%s bytes)\n",
              Progress::human_bytes(double(s.tensor_bytes)).c_str(),
              grouped(s.tensor_bytes).c_str());
  std::string dtypes;
  for (const auto& [dt, n] : s.dtypes)
    dtypes += (dtypes.empty() ? "" : ", ") + dtype_name(dt) + " (" + std::to_string(n) +
              (n == 1 ? " tensor)" : " tensors)");
  std::printf("  dtypes:       %s\n", dtypes.empty() ? "-" : dtypes.c_str());

  // The tensor table. Layers usually repeat one another, so a layer identical to the layer just
  // printed is folded into a count; a layer that differs (a missing tensor, another dtype) is
  // printed in full, which is where a reader wants to look.
  const bool show_file = s.files.size() > 1;
  size_t width = 4;
  for (const HfTensorInfo& t : s.tensors) width = std::max(width, t.name.size());
  std::printf("  tensors:      %zu\n", s.tensors.size());
  // The shape column is padded only when a file column follows it: no trailing blanks.
  if (show_file)
    std::printf("    %-*s %-5s %-16s %s\n", int(width), "name", "dtype", "shape", "file");
  else
    std::printf("    %-*s %-5s %s\n", int(width), "name", "dtype", "shape");
  auto print_row = [&](const HfTensorInfo& t) {
    if (show_file)
      std::printf("    %-*s %-5s %-16s %s\n", int(width), t.name.c_str(),
                  dtype_name(t.dtype).c_str(), shape_text(t.shape).c_str(), t.file.c_str());
    else
      std::printf("    %-*s %-5s %s\n", int(width), t.name.c_str(), dtype_name(t.dtype).c_str(),
                  shape_text(t.shape).c_str());
  };
  LayerSignature shown;  // of the last layer printed in full
  int shown_layer = -1, folded_from = -1, folded_to = -1;
  auto flush_folded = [&] {
    if (folded_from < 0) return;
    print_folded_layers(folded_from, folded_to);
    folded_from = folded_to = -1;
  };
  for (size_t i = 0; i < s.tensors.size();) {
    const HfTensorInfo& t = s.tensors[i];
    if (t.layer < 0) {
      flush_folded();
      print_row(t);
      ++i;
      continue;
    }
    std::vector<const HfTensorInfo*> layer;  // tensors are grouped by layer (hf.h)
    for (; i < s.tensors.size() && s.tensors[i].layer == t.layer; ++i)
      layer.push_back(&s.tensors[i]);
    LayerSignature sig = signature(layer);
    const int previous = folded_to >= 0 ? folded_to : shown_layer;
    if (shown_layer >= 0 && t.layer == previous + 1 && sig == shown) {
      if (folded_from < 0) folded_from = t.layer;
      folded_to = t.layer;
      continue;
    }
    flush_folded();
    for (const HfTensorInfo* lt : layer) print_row(*lt);
    shown = std::move(sig);
    shown_layer = t.layer;
  }
  flush_folded();

  if (!s.check.ignored.empty())
    std::printf(
        "  note: %zu rotary_emb.inv_freq buffer%s ignored; ft computes RoPE from "
        "config.json\n",
        s.check.ignored.size(), s.check.ignored.size() == 1 ? " is" : "s are");
  if (!s.check.tied_copy.empty() && s.compatible())
    std::printf("  note: %s equals model.embed_tokens.weight (tied embeddings); ft loads it once\n",
                s.check.tied_copy.c_str());
  for (const std::string& w : s.config_warnings) std::printf("  warning: %s\n", w.c_str());
  const TextSupport text = print_text_support(dir, m);
  if (s.compatible()) {
    std::printf(
        "  compatible with ft: yes, as model.from (config.json, and the tensors' names, shapes "
        "and dtypes; their values are checked as they load)\n");
    if (text.chat)
      std::printf(
          "  chat data:     yes: ft tokenize --format chat --tokenizer %s, model.from and "
          "tokenizer.path %s, ft generate %s --chat\n",
          dir.c_str(), dir.c_str(), dir.c_str());
    else
      std::printf(
          "  chat data:     no (%s). %s\n", text.missing.c_str(),
          text.tokenizer && text.template_renders
              ? "This folder's tokenizer serves ft tokenize of text and JSONL and ft generate "
                "without --chat; chat data (ft tokenize --format chat or alpaca, ft generate "
                "--chat) needs a tokenizer whose tokens spell the rendered text (a byte-level "
                "BPE tokenizer.json)"
          : text.tokenizer
              ? "This folder's tokenizer serves ft tokenize of text and JSONL and ft generate "
                "without --chat; chat data (ft tokenize --format chat or alpaca, ft generate "
                "--chat) needs the model's chat template too (chat_template.jinja, or "
                "tokenizer_config.json's chat_template)"
              : detail::concat("Without a tokenizer ft still trains the model (model.from) on "
                               "token shards of at most ",
                               m.vocab_size,
                               " ids made with another tokenizer.path; ft tokenize and ft "
                               "generate need a tokenizer, chat data a chat template too")
                    .c_str());
    return 0;
  }
  std::printf("  compatible with ft: no\n");
  for (const std::string& p : s.config_problems) std::printf("    config.json: %s\n", p.c_str());
  print_problems("missing", s.check.missing);
  print_problems("unexpected", s.check.unexpected);
  print_problems("", s.check.bad_tensors);
  for (const std::string& h : s.check.hints) std::printf("    hint: %s\n", h.c_str());
  std::fflush(stdout);  // the summary before the error line when both go to one terminal
  throw Error(dir + ": not usable by ft as model.from; the problems are listed above");
}

// ---- checkpoints (DESIGN.md §8, lib/ckpt/checkpoint.h) -------------------------------------

// "k v, k v" for the scalar members of a manifest object (scheduler, optimizer, data).
std::string scalar_members(const nlohmann::json& j, const std::vector<std::string>& skip = {}) {
  if (!j.is_object()) return j.is_null() ? "-" : j.dump();
  std::string out;
  for (const auto& [k, v] : j.items()) {
    if (v.is_structured() || std::find(skip.begin(), skip.end(), k) != skip.end()) continue;
    out += (out.empty() ? "" : ", ") + k + " " + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  return out.empty() ? "-" : out;
}

void print_verify_progress(size_t i, size_t n, const std::string& file) {
  std::fprintf(stderr, "\r  verifying %zu/%zu %s\033[K", i + 1, n, file.c_str());
  if (i + 1 == n) std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

// The model line shared with the HF summary's wording.
void print_model(const ModelConfig& m) {
  std::string head_dim = heads_whole(m) ? std::to_string(head_dim_of(m)) : "-";
  std::printf(
      "  model:        %s, dim %d, %d layer%s, %d head%s, %d kv head%s, head_dim %s, ffn %d, "
      "vocab %d, max_seq_len %d, %s, norm_eps %.6g, %s embeddings\n",
      m.arch.c_str(), m.dim, m.n_layers, m.n_layers == 1 ? "" : "s", m.n_heads,
      m.n_heads == 1 ? "" : "s", m.n_kv_heads, m.n_kv_heads == 1 ? "" : "s", head_dim.c_str(),
      m.ffn_dim, m.vocab_size, m.max_seq_len, rope_text(m).c_str(), m.norm_eps,
      m.tie_embeddings ? "tied" : "untied");
}

// The manifest's tensor table, with repeated layers folded as in the HF summary.
void print_checkpoint_tensors(const nlohmann::json& tensors) {
  struct Row {
    std::string name, dtype, shape, split;
    int layer = -1;
  };
  std::vector<Row> rows;
  size_t width = 4;
  for (const auto& t : tensors) {
    Row r;
    r.name = t.value("name", std::string("?"));
    r.dtype = t.value("dtype", std::string("?"));
    r.split = t.value("split", std::string("?"));
    r.shape = t.contains("shape") && t["shape"].is_array()
                  ? shape_text(t["shape"].get<std::vector<int64_t>>())
                  : "?";
    const std::string prefix = "model.layers.";
    if (r.name.rfind(prefix, 0) == 0) r.layer = std::atoi(r.name.c_str() + prefix.size());
    width = std::max(width, r.name.size());
    rows.push_back(std::move(r));
  }
  std::printf("  tensors:      %zu\n", rows.size());
  std::printf("    %-*s %-5s %-16s %s\n", int(width), "name", "dtype", "shape", "split");
  auto suffix = [](const Row& r) { return r.name.substr(r.name.find('.', 13)); };
  using Sig = std::vector<std::tuple<std::string, std::string, std::string, std::string>>;
  Sig shown;
  int shown_layer = -1, folded_from = -1, folded_to = -1;
  auto flush_folded = [&] {
    if (folded_from < 0) return;
    print_folded_layers(folded_from, folded_to);
    folded_from = folded_to = -1;
  };
  auto print_row = [&](const Row& r) {
    std::printf("    %-*s %-5s %-16s %s\n", int(width), r.name.c_str(), r.dtype.c_str(),
                r.shape.c_str(), r.split.c_str());
  };
  for (size_t i = 0; i < rows.size();) {
    if (rows[i].layer < 0) {
      flush_folded();
      print_row(rows[i++]);
      continue;
    }
    const int layer = rows[i].layer;
    size_t end = i;
    Sig sig;
    for (; end < rows.size() && rows[end].layer == layer; ++end)
      sig.emplace_back(suffix(rows[end]), rows[end].dtype, rows[end].shape, rows[end].split);
    const int previous = folded_to >= 0 ? folded_to : shown_layer;
    if (shown_layer >= 0 && layer == previous + 1 && sig == shown) {
      if (folded_from < 0) folded_from = layer;
      folded_to = layer;
    } else {
      flush_folded();
      for (size_t k = i; k < end; ++k) print_row(rows[k]);
      shown = std::move(sig);
      shown_layer = layer;
    }
    i = end;
  }
  flush_folded();
}

// One step folder: what it holds, then every checksum. Exit code 1 (by throwing, after the
// summary) when it is incomplete or any check fails, so a script can test `ft inspect STEP`.
int inspect_checkpoint_step(const std::string& dir) {
  std::error_code ec;
  const bool complete = fs::exists(fs::path(dir) / "COMPLETE", ec);
  const ckpt::Manifest m = ckpt::read_manifest(dir, /*allow_incomplete=*/true);
  const nlohmann::json& j = m.json;
  std::printf("checkpoint %s\n", dir.c_str());
  std::printf("  status:       %s\n",
              complete ? "complete" : "incomplete: COMPLETE is missing; never resumed from");
  std::printf(
      "  step:         %lld (optimizer steps completed; training continues with step "
      "%lld)\n",
      (long long)m.step, (long long)m.step + 1);
  if (j.contains("saved_at") || j.contains("ft_version"))
    std::printf("  saved:        %s by ft %s\n", j.value("saved_at", std::string("?")).c_str(),
                j.value("ft_version", std::string("?")).c_str());
  std::printf("  layout:       world %d = data %d × pipeline %d × tensor %d, ZeRO stage %d\n",
              m.world, m.data, m.pipeline, m.tensor, m.zero_stage);
  print_model(m.model);
  const ParamLayout layout(m.model, 1);
  const uint64_t params = layout.total_numel();
  std::printf("  parameters:   %s (%s)\n", short_count(params).c_str(), grouped(params).c_str());
  if (m.adapter.enabled()) {
    const uint64_t adapter = manifest_layout(m, 1).total_numel() - params;
    std::string targets;
    for (const std::string& t : m.adapter.target_modules)
      targets += (targets.empty() ? "" : ", ") + t;
    std::printf("  adapter:      %s r %d, alpha %g%s on %s: %s parameters (%s), the base frozen\n",
                m.adapter.type.c_str(), m.adapter.r, m.adapter.alpha,
                m.adapter.use_rslora ? " (rsLoRA)" : "", targets.c_str(),
                short_count(adapter).c_str(), grouped(adapter).c_str());
  }
  const nlohmann::json none;
  const nlohmann::json& opt = j.contains("optimizer") ? j["optimizer"] : none;
  std::printf("  optimizer:    %s (step %lld)\n", scalar_members(opt, {"step"}).c_str(),
              (long long)m.optimizer_step);
  std::printf("  scheduler:    %s\n",
              scalar_members(j.contains("scheduler") ? j["scheduler"] : none).c_str());
  std::printf("  data:         %s\n",
              scalar_members(j.contains("data") ? j["data"] : none).c_str());
  const nlohmann::json& tok = j.contains("tokenizer") ? j["tokenizer"] : none;
  if (tok.is_object())
    std::printf("  tokenizer:    %s (sha256 %s)\n", tok.value("file", std::string("?")).c_str(),
                tok.value("sha256", std::string("?")).c_str());
  else
    std::printf("  tokenizer:    none (the recipe named no tokenizer.path)\n");
  if (j.contains("tensors") && j["tensors"].is_array()) print_checkpoint_tensors(j["tensors"]);

  uint64_t total = 0;
  size_t width = 4;
  for (const ckpt::ShardRecord& s : m.shards) {
    total += s.bytes;
    width = std::max(width, s.file.size());
  }
  std::map<ckpt::State, size_t> per_state;
  for (const ckpt::PieceRecord& p : m.pieces) ++per_state[p.state];
  std::string states;
  for (const auto& [st, n] : per_state)
    states += (states.empty() ? "" : ", ") + std::to_string(n) + " " + ckpt::state_name(st);
  std::printf("  shard files:  %zu (%s), %zu pieces (%s)\n", m.shards.size(),
              Progress::human_bytes(double(total)).c_str(), m.pieces.size(), states.c_str());
  for (const ckpt::ShardRecord& s : m.shards)
    std::printf("    %-*s rank %-4d %10s  crc32 %08x\n", int(width), s.file.c_str(), s.rank,
                Progress::human_bytes(double(s.bytes)).c_str(), s.crc32);
  std::printf("  total bytes:  %s (%s bytes)\n", Progress::human_bytes(double(total)).c_str(),
              grouped(total).c_str());
  std::fflush(stdout);

  const std::vector<std::string> problems =
      ckpt::verify(m, isatty(STDERR_FILENO) ? print_verify_progress : nullptr);
  if (problems.empty()) {
    std::printf("  checksums:    all %zu pieces in %zu files verified\n", m.pieces.size(),
                m.shards.size());
  } else {
    std::printf("  checksums:    %zu problem%s\n", problems.size(),
                problems.size() == 1 ? "" : "s");
    for (const std::string& p : problems) std::printf("    %s\n", p.c_str());
  }
  std::fflush(stdout);  // the summary before the error line when both go to one terminal
  if (!problems.empty())
    throw Error(
        dir + ": checkpoint is damaged (" + problems.front() +
        (problems.size() > 1 ? "; and " + std::to_string(problems.size() - 1) + " more" : "") +
        "); resume from an older step folder");
  if (!complete)
    throw Error(dir +
                ": incomplete checkpoint (no COMPLETE file): the save was interrupted, and "
                "ft never resumes from it");
  return 0;
}

// A checkpoint.dir: its step folders, which one `latest` names, then that one in detail.
int inspect_checkpoint_root(const std::string& dir) {
  // Step folders, and those --resume auto set aside as damaged (step_N.damaged[.K]): listed and
  // labelled, never chosen below.
  std::vector<std::string> steps, set_aside;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory(ec)) continue;
    if (ckpt::parse_step_folder_name(name) >= 0)
      steps.push_back(name);
    else if (ckpt::parse_step_folder_name(name, /*set_aside=*/true) >= 0)
      set_aside.push_back(name);
  }
  std::sort(steps.begin(), steps.end());
  std::sort(set_aside.begin(), set_aside.end());
  // Read here rather than by ckpt::latest_checkpoint, which refuses a `latest` naming a folder
  // that is gone: inspect lists the folders and says so.
  std::string latest_name, latest_problem;
  try {
    latest_name = latest_step_name(dir);
  } catch (const Error& e) {
    latest_problem = e.what();
  }
  std::string latest = latest_name.empty() ? "" : (fs::path(dir) / latest_name).string();
  std::printf("checkpoint folder %s\n", dir.c_str());
  std::printf("  step folders: %zu\n", steps.size());
  for (const std::string& s : steps) {
    const fs::path p = fs::path(dir) / s;
    const char* state = fs::exists(p / "COMPLETE", ec)        ? "complete"
                        : fs::exists(p / "manifest.json", ec) ? "incomplete (no COMPLETE)"
                                                              : "incomplete (no manifest.json)";
    std::printf("    %s  %s%s\n", s.c_str(), state, s == latest_name ? "  <- latest" : "");
  }
  for (const std::string& s : set_aside)
    std::printf(
        "    %s  damaged: set aside by --resume auto, never resumed from (inspect it "
        "with ft inspect %s/%s; remove it when done)\n",
        s.c_str(), dir.c_str(), s.c_str());
  bool ignored = !latest_problem.empty();
  if (ignored) std::printf("  latest:       unusable (%s); ignored\n", latest_problem.c_str());
  if (!latest.empty() && !fs::exists(fs::path(latest) / "manifest.json", ec)) {
    std::printf("  latest:       names %s, which is not here (set aside as damaged?); ignored\n",
                latest_name.c_str());
    latest.clear();
    latest_name.clear();
    ignored = true;
  }
  std::string target = latest;
  if (latest.empty()) {
    const std::vector<std::string> complete = ckpt::complete_checkpoints(dir);
    if (!complete.empty()) {
      target = complete.front();
      std::printf("%s below, the newest complete step folder (what --resume auto takes)\n",
                  ignored ? "  instead:     " : "  latest:       missing;");
    } else if (!steps.empty()) {
      target = (fs::path(dir) / steps.back()).string();
      std::printf("%s no step folder is complete; below, the newest\n",
                  ignored ? "  instead:     " : "  latest:       missing, and");
    }
  } else {
    std::printf("  latest:       %s\n", latest_name.c_str());
  }
  std::printf("\n");
  if (target.empty()) throw Error(dir + ": holds no step folders; nothing to inspect");
  // Without `latest`, the newest complete folder (a crash between COMPLETE and `latest`), else
  // the newest folder, which then reports itself incomplete.
  return inspect_checkpoint_step(target);
}

}  // namespace

int cmd_inspect(const InspectArgs& a) {
  std::error_code ec;
  if (!fs::exists(a.path, ec)) throw UsageError(a.path + ": no such file or folder");
  if (!fs::is_directory(a.path, ec))
    throw UsageError(a.path +
                     ": not a folder; ft inspect takes a shard folder, checkpoint or "
                     "Hugging Face folder");
  const FolderKind kind = classify(a.path);
  if (a.seq_len > 0 && kind != FolderKind::kShards)
    throw UsageError(a.path + ": --seq-len applies to shard folders (how data.pack packs them)");
  switch (kind) {
    case FolderKind::kShards:
      return inspect_shards(a.path, a.seq_len, a.pack_overflow);
    case FolderKind::kCheckpoint:
      if (fs::exists(fs::path(a.path) / "manifest.json", ec))
        return inspect_checkpoint_step(a.path);
      return inspect_checkpoint_root(a.path);
    case FolderKind::kHuggingFace:
      return inspect_hf(a.path);
    case FolderKind::kUnknown:
      break;
  }
  throw UsageError(a.path +
                   ": not a shard folder, checkpoint or Hugging Face folder (found no "
                   "*.h5 files, manifest.json, latest, step_* folders or config.json)");
}

}  // namespace ft::app
