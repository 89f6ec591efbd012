// Reading manifest.json and rank_*.json while trusting nothing in them (DESIGN.md §8):
// parse_manifest, read_manifest, parse_rank_json, and the names of the state kinds.
//
// Invariants: every number is checked to be a JSON integer within its field's range before it
// is converted, so no damaged value reaches a float-to-int conversion, an allocation or a file
// offset; every piece lies inside its group and its shard file, and the pieces tile each group
// and each file exactly; every failure is an ft::Error naming the file and the key path, never
// another exception type. The writer (writer.cpp) commits only a manifest that passes these.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <tuple>

#include "adapt/lora.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_internal.h"
#include "ckpt/io.h"
#include "core/error.h"
#include "core/json_describe.h"
#include "model/arch.h"
#include "model/layout.h"
#include "model/rope.h"

namespace ft::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;

const char* state_name(State s) {
  switch (s) {
    case State::kParam:
      return "param";
    case State::kExpAvg:
      return "exp_avg";
    case State::kExpAvgSq:
      return "exp_avg_sq";
  }
  return "?";
}

namespace {

State parse_state(const std::string& s, const std::string& file) {
  if (s == "param") return State::kParam;
  if (s == "exp_avg") return State::kExpAvg;
  if (s == "exp_avg_sq") return State::kExpAvgSq;
  throw Error(file + ": unknown state kind '" + s + "' in a piece; the checkpoint is damaged");
}

// Reads a checkpoint's JSON defensively: each value's JSON type and range are checked before it
// is converted, so that no damaged number reaches a float-to-int conversion (undefined
// behaviour), an allocation or a file offset. Errors name the file and the key path
// ("pieces[3].end"). Only scalars are ever dumped into messages: dump() recurses.
class JsonReader {
 public:
  explicit JsonReader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw Error(file_ + ": " + path + ": " + what + "; the checkpoint is damaged");
  }
  static std::string path_of(const std::string& parent, const char* key) {
    return parent.empty() ? std::string(key) : parent + "." + key;
  }
  static std::string describe(const json& v) { return describe_json_value(v); }

  const json& object(const json& v, const std::string& path) const {
    if (!v.is_object()) fail(path, "expected an object, found " + describe(v));
    return v;
  }
  const json& array(const json& v, const std::string& path) const {
    if (!v.is_array()) fail(path, "expected an array, found " + describe(v));
    return v;
  }
  // obj.key of an object obj (reported as `parent`), which must be there.
  const json& at(const json& obj, const std::string& parent, const char* key) const {
    object(obj, parent.empty() ? "the document" : parent);
    const auto it = obj.find(key);
    if (it == obj.end()) fail(path_of(parent, key), "missing");
    return *it;
  }
  // A JSON integer (not a float such as 3.0 or 1e30, not a bool, not a string) in [lo, hi].
  int64_t integer(const json& v, const std::string& path, int64_t lo, int64_t hi) const {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        if (hi >= 0 && u <= uint64_t(hi) && int64_t(u) >= lo) return int64_t(u);
      } else {
        const int64_t i = v.get<int64_t>();
        if (i >= lo && i <= hi) return i;
      }
    }
    fail(path,
         detail::concat("expected an integer from ", lo, " to ", hi, ", found ", describe(v)));
  }
  uint64_t uinteger(const json& v, const std::string& path, uint64_t lo, uint64_t hi) const {
    if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) {
      const uint64_t u = v.get<uint64_t>();
      if (u >= lo && u <= hi) return u;
    }
    fail(path,
         detail::concat("expected an integer from ", lo, " to ", hi, ", found ", describe(v)));
  }
  double real(const json& v, const std::string& path, double lo, double hi) const {
    if (v.is_number()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d >= lo && d <= hi) return d;
    }
    fail(path, detail::concat("expected a number from ", lo, " to ", hi, ", found ", describe(v)));
  }
  std::string text(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "expected a string, found " + describe(v));
    return v.get<std::string>();
  }
  bool flag(const json& v, const std::string& path) const {
    if (!v.is_boolean()) fail(path, "expected true or false, found " + describe(v));
    return v.get<bool>();
  }
  // A file name inside the step folder: no folder part, so nothing outside it is ever read.
  std::string file_name(const json& v, const std::string& path) const {
    std::string s = text(v, path);
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos ||
        s.find('\0') != std::string::npos)
      fail(path, "expected a file name inside the step folder, found " + describe(v));
    return s;
  }

  int64_t int_at(const json& o, const std::string& parent, const char* key, int64_t lo,
                 int64_t hi) const {
    return integer(at(o, parent, key), path_of(parent, key), lo, hi);
  }
  uint64_t uint_at(const json& o, const std::string& parent, const char* key, uint64_t lo,
                   uint64_t hi) const {
    return uinteger(at(o, parent, key), path_of(parent, key), lo, hi);
  }

 private:
  std::string file_;
};

// The step number a step folder's path names, or -1 (a folder named otherwise, as a copy the
// user made for --resume PATH).
int64_t step_of_dir(const std::string& step_dir) {
  fs::path p = fs::path(step_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return parse_step_folder_name(p.filename().string(), /*set_aside=*/true);
}

// The model config of a manifest, each field range-checked, then checked as a whole: what
// ParamLayout needs (divisibility) and a total size within kMaxElements, computed in 128 bits
// so that no product overflows before it is compared.
ModelConfig parse_model(const JsonReader& r, const json& mc) {
  ModelConfig c;
  const std::string p = "model";
  c.arch = r.text(r.at(mc, p, "arch"), "model.arch");
  if (!is_implemented_arch(c.arch))
    r.fail("model.arch", "unknown architecture " + JsonReader::describe(mc.at("arch")));
  c.dim = int(r.int_at(mc, p, "dim", 1, kMaxModelDim));
  c.n_layers = int(r.int_at(mc, p, "n_layers", 1, kMaxLayers));
  c.n_heads = int(r.int_at(mc, p, "n_heads", 1, c.dim));
  c.n_kv_heads = int(r.int_at(mc, p, "n_kv_heads", 1, c.n_heads));
  // Absent unless the heads are not dim / n_heads wide.
  if (mc.contains("head_dim")) c.head_dim = int(r.int_at(mc, p, "head_dim", 2, kMaxModelDim));
  c.ffn_dim = int(r.int_at(mc, p, "ffn_dim", 1, kMaxModelDim));
  c.vocab_size = int(r.int_at(mc, p, "vocab_size", 1, kMaxModelDim));
  c.max_seq_len = int(r.int_at(mc, p, "max_seq_len", 1, kMaxModelDim));
  c.rope_theta = r.real(r.at(mc, p, "rope_theta"), "model.rope_theta", 1e-30, 1e30);
  c.norm_eps = r.real(r.at(mc, p, "norm_eps"), "model.norm_eps", 0, 1);
  c.tie_embeddings = r.flag(r.at(mc, p, "tie_embeddings"), "model.tie_embeddings");
  // Absent from manifests of default-RoPE runs and of builds before RoPE scaling.
  if (mc.contains("rope_scaling")) {
    const json& rs = mc.at("rope_scaling");
    const std::string q = "model.rope_scaling";
    if (!rs.is_object()) r.fail(q, "expected an object, found " + JsonReader::describe(rs));
    c.rope_type = r.text(r.at(rs, q, "rope_type"), q + ".rope_type");
    if (!is_rope_type(c.rope_type))
      r.fail(q + ".rope_type", "\"" + c.rope_type +
                                   "\" is not implemented by this ft; use the ft that wrote the "
                                   "checkpoint");
    c.rope_factor = r.real(r.at(rs, q, "factor"), q + ".factor", 1e-30, 1e30);
    c.rope_low_freq_factor =
        r.real(r.at(rs, q, "low_freq_factor"), q + ".low_freq_factor", 1e-30, 1e30);
    c.rope_high_freq_factor =
        r.real(r.at(rs, q, "high_freq_factor"), q + ".high_freq_factor", 1e-30, 1e30);
    c.rope_original_max_seq_len = int(r.int_at(rs, q, "original_max_seq_len", 1, kMaxModelDim));
  }
  if (!heads_whole(c))
    r.fail("model.n_heads", detail::concat(c.n_heads, " does not divide model.dim ", c.dim));
  if (c.n_heads % c.n_kv_heads != 0)
    r.fail("model.n_kv_heads",
           detail::concat(c.n_kv_heads, " does not divide model.n_heads ", c.n_heads));
  using u128 = unsigned __int128;
  const u128 C = u128(c.dim), V = u128(c.vocab_size), F = u128(c.ffn_dim);
  const u128 D = u128(head_dim_of(c));
  const u128 HD = u128(c.n_heads) * D, KVD = u128(c.n_kv_heads) * D;
  const u128 block = 2 * C + 2 * HD * C + 2 * KVD * C + 3 * F * C +
                     (arch_of(c).qkv_bias ? HD + 2 * KVD : 0) + (arch_of(c).qk_norm ? 2 * D : 0);
  const u128 total = V * C + u128(c.n_layers) * block + C + (c.tie_embeddings ? 0 : V * C);
  if (total > kMaxElements)
    r.fail("model", detail::concat("a model of more than ", kMaxElements, " parameters (dim ",
                                   c.dim, ", n_layers ", c.n_layers, ", ffn_dim ", c.ffn_dim,
                                   ", vocab_size ", c.vocab_size, ")"));
  return c;
}

}  // namespace

ParamLayout manifest_layout(const Manifest& m, int tensor) {
  ModelConverters converters;
  if (m.adapter.type == "lora" || m.adapter.type == "qlora")
    converters.push_back(std::make_unique<LoraConverter>(m.adapter));
  return converted_layout(m.model, tensor, &converters);
}

Manifest parse_manifest(const std::string& text, const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  const JsonReader r(path);
  Manifest m;
  m.dir = step_dir;
  try {
    m.json = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON (" + json_error_words(e) + "); the checkpoint is damaged");
  }
  const json& j = r.object(m.json, "the document");
  if (!j.contains("format") || j["format"] != "ft-checkpoint")
    throw Error(path + ": not an ft checkpoint manifest (format is not \"ft-checkpoint\")");
  if (r.int_at(j, "", "version", INT64_MIN, INT64_MAX) != 1)
    throw Error(path + ": checkpoint format version " + j["version"].dump() +
                " is not supported by this ft (1)");

  // The step: a count of optimizer steps, and the number in the folder's name.
  m.step = r.int_at(j, "", "step", 0, kMaxStep);
  const int64_t named = step_of_dir(step_dir);
  if (named >= 0 && named != m.step)
    r.fail("step", detail::concat(m.step, ", but the folder's name says step ", named,
                                  " (a manifest copied from another folder, or a damaged one)"));

  const json& l = r.at(j, "", "layout");
  m.world = int(r.int_at(l, "layout", "world", 1, kMaxRanks));
  m.data = int(r.int_at(l, "layout", "data", 1, kMaxRanks));
  m.tensor = int(r.int_at(l, "layout", "tensor", 1, kMaxRanks));
  m.pipeline = int(r.int_at(l, "layout", "pipeline", 1, kMaxRanks));
  m.zero_stage = int(r.int_at(l, "layout", "zero_stage", 0, 3));
  if (int64_t(m.data) * m.tensor * m.pipeline != m.world)
    r.fail("layout", detail::concat("world ", m.world, " is not data ", m.data, " x tensor ",
                                    m.tensor, " x pipeline ", m.pipeline));
  m.model = parse_model(r, r.at(j, "", "model"));
  const ModelConfig& c = m.model;
  if (c.n_heads % m.tensor || c.n_kv_heads % m.tensor || c.ffn_dim % m.tensor ||
      c.vocab_size % m.tensor)
    r.fail("layout.tensor", detail::concat(m.tensor, " does not divide the model's heads (",
                                           c.n_heads, "), kv heads (", c.n_kv_heads, "), ffn_dim (",
                                           c.ffn_dim, ") and vocab_size (", c.vocab_size, ")"));
  if (m.pipeline > c.n_layers)
    r.fail("layout.pipeline", detail::concat(m.pipeline, " stages for ", c.n_layers, " layers"));
  m.optimizer_step = r.int_at(r.at(j, "", "optimizer"), "optimizer", "step", 0, kMaxStep);

  // Optional sections that the trainer, export and inspect read: typed here, so that they never
  // meet a conversion that throws something other than Error (or is undefined).
  if (j.contains("data")) {
    const json& d = r.object(j["data"], "data");
    if (d.contains("tokens")) m.tokens = r.int_at(d, "data", "tokens", 0, INT64_MAX);
    if (d.contains("next_step") && r.int_at(d, "data", "next_step", 0, kMaxStep) != m.step)
      r.fail("data.next_step", detail::concat(d["next_step"].dump(), ", not the step ", m.step));
    if (d.contains("global_batch_size")) r.int_at(d, "data", "global_batch_size", 1, INT32_MAX);
    if (d.contains("seq_len")) r.int_at(d, "data", "seq_len", 1, INT32_MAX);
    if (d.contains("seed")) r.uint_at(d, "data", "seed", 0, UINT64_MAX);
    if (d.contains("shuffle")) r.flag(d["shuffle"], "data.shuffle");
    if (d.contains("pack")) r.flag(d["pack"], "data.pack");
    if (d.contains("pack_overflow")) r.text(d["pack_overflow"], "data.pack_overflow");
    if (d.contains("train")) r.text(d["train"], "data.train");
  }
  if (j.contains("scheduler")) {
    // The schedule advances with applied steps only (as DeepSpeed's and Megatron's): an fp16
    // step skipped for overflow leaves it behind the step count, never ahead of it.
    const json& s = r.object(j["scheduler"], "scheduler");
    if (s.contains("step") && r.int_at(s, "scheduler", "step", 0, kMaxStep) > m.step)
      r.fail("scheduler.step", detail::concat(s["step"].dump(), ", past the step ", m.step));
  }
  if (j.contains("loss_scaler")) m.loss_scaler = LossScalerState::from_json(j["loss_scaler"], path);
  if (j.contains("tokenizer") && !j["tokenizer"].is_null()) {
    const json& t = r.object(j["tokenizer"], "tokenizer");
    if (t.contains("file")) r.file_name(t["file"], "tokenizer.file");
    if (t.contains("sha256")) r.text(t["sha256"], "tokenizer.sha256");
  }

  // The adapter (key adapter, written by adapter runs only): its groups follow the model's.
  if (j.contains("adapter")) {
    const json& a = r.object(j["adapter"], "adapter");
    AdapterConfig& ad = m.adapter;
    ad.type = r.text(r.at(a, "adapter", "type"), "adapter.type");
    if (ad.type != "lora" && ad.type != "qlora")
      r.fail("adapter.type",
             "unknown adapter type " + JsonReader::describe(a["type"]) + " (lora, qlora)");
    ad.r = int(r.int_at(a, "adapter", "r", 1, kMaxAdapterRank));
    ad.alpha = r.real(r.at(a, "adapter", "alpha"), "adapter.alpha", 1e-30, 1e30);
    ad.dropout = r.real(r.at(a, "adapter", "dropout"), "adapter.dropout", 0, 0.999999);
    ad.use_rslora = r.flag(r.at(a, "adapter", "use_rslora"), "adapter.use_rslora");
    ad.init = r.text(r.at(a, "adapter", "init"), "adapter.init");
    ad.from = r.text(r.at(a, "adapter", "from"), "adapter.from");
    const json& tm = r.array(r.at(a, "adapter", "target_modules"), "adapter.target_modules");
    ad.target_modules.clear();
    for (size_t i = 0; i < tm.size(); ++i) {
      const std::string path = detail::concat("adapter.target_modules[", i, "]");
      const std::string name = r.text(tm[i], path);
      if (!is_lora_target(name) || name == "all-linear")
        r.fail(path, "unknown module " + JsonReader::describe(tm[i]) +
                         " (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
      ad.target_modules.push_back(name);
    }
    if (ad.target_modules.empty()) r.fail("adapter.target_modules", "empty");
    // Modules trained whole (absent in manifests from before them: none).
    if (a.contains("modules_to_save")) {
      const json& ms = r.array(a["modules_to_save"], "adapter.modules_to_save");
      for (size_t i = 0; i < ms.size(); ++i) {
        const std::string path = detail::concat("adapter.modules_to_save[", i, "]");
        const std::string name = r.text(ms[i], path);
        if ((name != "embed_tokens" && name != "lm_head") || ad.saves(name))
          r.fail(path, "unknown or repeated module " + JsonReader::describe(ms[i]) +
                           " (embed_tokens, lm_head)");
        ad.modules_to_save.push_back(name);
      }
    }
    // Its size within the checkpoint's bound too: r (in + out) per projection and block.
    using u128 = unsigned __int128;
    const u128 C = u128(c.dim), F = u128(c.ffn_dim), D = u128(head_dim_of(c));
    const u128 HD = u128(c.n_heads) * D, KVD = u128(c.n_kv_heads) * D;
    u128 per_block = 0;
    for (const std::string& t : ad.targets())
      per_block += t == "q_proj"                        ? C + HD
                   : t == "k_proj" || t == "v_proj"     ? C + KVD
                   : t == "o_proj"                      ? HD + C
                   : t == "gate_proj" || t == "up_proj" ? C + F
                                                        : F + C;
    if (u128(ad.r) * per_block * u128(c.n_layers) > kMaxElements)
      r.fail("adapter", detail::concat("an adapter of more than ", kMaxElements, " parameters"));
  }

  // The tensor table (written by the trainer; optional for other writers) must be the model's.
  const ParamLayout whole = manifest_layout(m, 1);
  if (j.contains("tensors")) {
    const json& ts = r.array(j["tensors"], "tensors");
    size_t k = 0;
    for (size_t g = 0; g < whole.groups().size(); ++g)
      for (const ParamEntry& e : whole.groups()[g].entries) {
        const std::string tp = detail::concat("tensors[", k, "]");
        if (k >= ts.size())
          r.fail("tensors", detail::concat(ts.size(), " entries; the model has more"));
        const json& t = ts[k++];
        if (r.text(r.at(t, tp, "name"), tp + ".name") != e.name)
          r.fail(tp + ".name", "expected " + e.name + " here (the model's tensor order)");
        const json& shape = r.array(r.at(t, tp, "shape"), tp + ".shape");
        bool same = shape.size() == e.global_shape.size();
        for (size_t i = 0; i < shape.size(); ++i) {
          const int64_t d =
              r.integer(shape[i], detail::concat(tp, ".shape[", i, "]"), 1, int64_t(kMaxElements));
          same = same && i < e.global_shape.size() && d == e.global_shape[i];
        }
        if (!same) r.fail(tp + ".shape", "differs from " + e.name + "'s shape in the model");
        if (r.text(r.at(t, tp, "dtype"), tp + ".dtype") != "f32")
          r.fail(tp + ".dtype",
                 "unknown dtype " + JsonReader::describe(t["dtype"]) + " (checkpoints hold f32)");
        if (r.int_at(t, tp, "group", 0, int64_t(whole.groups().size()) - 1) != int64_t(g))
          r.fail(tp + ".group", detail::concat("expected ", g, " for ", e.name));
        if (t.contains("split")) {
          const std::string s = r.text(t["split"], tp + ".split");
          const char* want = e.split == TensorSplit::kRows   ? "rows"
                             : e.split == TensorSplit::kCols ? "cols"
                                                             : "replicated";
          if (s != want) r.fail(tp + ".split", std::string("expected ") + want + " for " + e.name);
        }
      }
    if (k != ts.size())
      r.fail("tensors", detail::concat(ts.size(), " entries; the model has ", k, " tensors"));
  }

  // Frozen groups: no piece of theirs may be there (checked with the tiling below).
  std::vector<bool> frozen(whole.groups().size(), false);
  if (j.contains("frozen")) {
    const json& f = r.object(j["frozen"], "frozen");
    const json& gs = r.array(r.at(f, "frozen", "groups"), "frozen.groups");
    for (size_t i = 0; i < gs.size(); ++i) {
      const std::string gp = detail::concat("frozen.groups[", i, "]");
      const int g = int(r.integer(gs[i], gp, 0, int64_t(whole.groups().size()) - 1));
      if (frozen[size_t(g)]) r.fail(gp, detail::concat("names group ", g, " again"));
      frozen[size_t(g)] = true;
      m.frozen_groups.push_back(g);
    }
    if (f.contains("from")) m.frozen_from = r.text(f["from"], "frozen.from");
    if (f.contains("from_fingerprint"))
      m.frozen_from_fingerprint = r.text(f["from_fingerprint"], "frozen.from_fingerprint");
    if (f.contains("seed")) m.frozen_seed = r.uint_at(f, "frozen", "seed", 0, UINT64_MAX);
    if (f.contains("init_std")) m.frozen_init_std = r.real(f["init_std"], "frozen.init_std", 0, 10);
  }

  // Shards: one per rank, in rank order, each a plain file name.
  const json& shards = r.array(r.at(j, "", "shards"), "shards");
  if (int64_t(shards.size()) != m.world)
    r.fail("shards", detail::concat(shards.size(), " shard files for a world of ", m.world));
  std::map<std::string, size_t> shard_of;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string sp = detail::concat("shards[", i, "]");
    ShardRecord s;
    s.file = r.file_name(r.at(shards[i], sp, "file"), sp + ".file");
    s.rank = int(r.int_at(shards[i], sp, "rank", int64_t(i), int64_t(i)));
    s.bytes = r.uint_at(shards[i], sp, "bytes", 0, kMaxBytes);
    s.crc32 = uint32_t(r.uint_at(shards[i], sp, "crc32", 0, UINT32_MAX));
    if (!shard_of.emplace(s.file, i).second) r.fail(sp + ".file", "names " + s.file + " again");
    m.shards.push_back(std::move(s));
  }

  // Pieces: each inside its group (at the saved tensor size) and inside its shard file, checked
  // before anything is allocated or read for it.
  const ParamLayout saved = manifest_layout(m, m.tensor);
  const auto& groups = saved.groups();
  const json& pieces = r.array(r.at(j, "", "pieces"), "pieces");
  m.pieces.reserve(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const std::string pp = detail::concat("pieces[", i, "]");
    const json& p = r.object(pieces[i], pp);
    PieceRecord q;
    q.file = r.file_name(r.at(p, pp, "file"), pp + ".file");
    const auto sh = shard_of.find(q.file);
    if (sh == shard_of.end()) r.fail(pp + ".file", q.file + " is not one of the shards");
    const std::string st = r.text(r.at(p, pp, "state"), pp + ".state");
    if (st != "param" && st != "exp_avg" && st != "exp_avg_sq")
      r.fail(pp + ".state", "unknown state kind " + JsonReader::describe(p["state"]) +
                                " (param, exp_avg or exp_avg_sq)");
    q.state = parse_state(st, path);
    q.group = int(r.int_at(p, pp, "group", 0, int64_t(groups.size()) - 1));
    q.tensor_rank = int(r.int_at(p, pp, "tensor_rank", 0, m.tensor - 1));
    const uint64_t numel = groups[size_t(q.group)].numel;
    q.begin = r.uint_at(p, pp, "begin", 0, numel);
    q.end = r.uint_at(p, pp, "end", 0, numel);
    if (q.end <= q.begin)
      r.fail(pp, detail::concat("an empty or reversed range [", q.begin, ", ", q.end, ")"));
    const uint64_t file_bytes = m.shards[sh->second].bytes;
    q.offset = r.uint_at(p, pp, "offset", 0, file_bytes);
    if ((q.end - q.begin) * sizeof(float) > file_bytes - q.offset)
      r.fail(pp, detail::concat("bytes ", q.offset, "..", q.offset + (q.end - q.begin) * 4,
                                " lie past the end of ", q.file, " (", file_bytes, " bytes)"));
    q.crc32 = uint32_t(r.uint_at(p, pp, "crc32", 0, UINT32_MAX));
    m.pieces.push_back(std::move(q));
  }

  // The pieces tile every (state, group, tensor rank) buffer and every shard file exactly: no
  // gap (a value never read), no overlap (two values for one element).
  std::vector<size_t> order(m.pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto key = [&](size_t i) {
    const PieceRecord& q = m.pieces[i];
    return std::make_tuple(int(q.state), q.group, q.tensor_rank, q.begin);
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  {
    size_t k = 0;
    for (int s = 0; s < 3; ++s)
      for (int g = 0; g < int(groups.size()); ++g)
        for (int t = 0; t < m.tensor; ++t) {
          uint64_t at = 0;
          while (k < order.size()) {
            const PieceRecord& q = m.pieces[order[k]];
            if (int(q.state) != s || q.group != g || q.tensor_rank != t) break;
            if (q.begin != at)
              r.fail(detail::concat("pieces[", order[k], "]"),
                     detail::concat(q.begin < at ? "overlaps" : "leaves a gap before", " ",
                                    state_name(q.state), " of group ", g, " (tensor rank ", t,
                                    ") at element ", std::min(at, q.begin)));
            at = q.end;
            ++k;
          }
          if (frozen[size_t(g)] && at != 0)
            r.fail("pieces", detail::concat(state_name(State(s)), " of group ", g,
                                            " is there, but frozen.groups names it"));
          if (!frozen[size_t(g)] && at != groups[size_t(g)].numel)
            r.fail("pieces", detail::concat(state_name(State(s)), " of group ", g, " (tensor rank ",
                                            t, ") is covered up to element ", at, " of ",
                                            groups[size_t(g)].numel));
        }
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const PieceRecord &x = m.pieces[a], &y = m.pieces[b];
    return std::tie(x.file, x.offset) < std::tie(y.file, y.offset);
  });
  std::vector<uint64_t> filled(m.shards.size(), 0);
  for (size_t k : order) {
    const PieceRecord& q = m.pieces[k];
    uint64_t& at = filled[shard_of[q.file]];
    if (q.offset != at)
      r.fail(detail::concat("pieces[", k, "].offset"),
             detail::concat(q.offset < at ? "overlaps another piece" : "leaves a gap", " in ",
                            q.file, " at byte ", std::min(at, q.offset)));
    at += (q.end - q.begin) * sizeof(float);
  }
  for (size_t i = 0; i < m.shards.size(); ++i)
    if (filled[i] != m.shards[i].bytes)
      r.fail(detail::concat("shards[", i, "].bytes"),
             detail::concat(m.shards[i].bytes, ", but its pieces fill ", filled[i]));
  return m;
}

Manifest read_manifest(const std::string& step_dir, bool allow_incomplete) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  if (!fs::exists(path))
    throw Error(step_dir + ": no manifest.json; not a checkpoint step folder (or a save that " +
                "never finished)");
  if (!allow_incomplete && !fs::exists(fs::path(step_dir) / "COMPLETE"))
    throw Error(step_dir + ": no COMPLETE marker: the save never finished; resume from an " +
                "earlier checkpoint");
  return parse_manifest(read_text(path), step_dir);
}

RankRecord parse_rank_json(const std::string& text, const std::string& path) {
  const JsonReader r(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON (" + json_error_words(e) + "); the checkpoint is damaged");
  }
  RankRecord rr;
  rr.rank = int(r.int_at(j, "", "rank", 0, kMaxRanks - 1));
  rr.attempt = r.uint_at(j, "", "attempt", 0, UINT64_MAX);
  rr.file = r.file_name(r.at(j, "", "file"), "file");
  rr.bytes = r.uint_at(j, "", "bytes", 0, kMaxBytes);
  rr.crc32 = uint32_t(r.uint_at(j, "", "crc32", 0, UINT32_MAX));
  const json& pieces = r.array(r.at(j, "", "pieces"), "pieces");
  // The group sizes are the manifest's business (parse_manifest checks them at commit); here,
  // each piece is typed and lies inside this rank's file, back to back as the writer puts them.
  uint64_t at = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const std::string pp = detail::concat("pieces[", i, "]");
    const json& p = pieces[i];
    if (r.file_name(r.at(p, pp, "file"), pp + ".file") != rr.file)
      r.fail(pp + ".file", "is not this rank's file " + rr.file);
    const std::string st = r.text(r.at(p, pp, "state"), pp + ".state");
    if (st != "param" && st != "exp_avg" && st != "exp_avg_sq")
      r.fail(pp + ".state", "unknown state kind " + JsonReader::describe(p["state"]));
    r.int_at(p, pp, "group", 0, kMaxLayers + 1);
    r.int_at(p, pp, "tensor_rank", 0, kMaxRanks - 1);
    const uint64_t begin = r.uint_at(p, pp, "begin", 0, kMaxElements);
    const uint64_t end = r.uint_at(p, pp, "end", begin + 1, kMaxElements);
    if (r.uint_at(p, pp, "offset", 0, kMaxBytes) != at)
      r.fail(pp + ".offset", detail::concat("expected ", at, " (pieces lie back to back)"));
    r.uint_at(p, pp, "crc32", 0, UINT32_MAX);
    at += (end - begin) * sizeof(float);
    if (at > rr.bytes) r.fail(pp, detail::concat("ends past the file's ", rr.bytes, " bytes"));
  }
  if (at != rr.bytes) r.fail("bytes", detail::concat(rr.bytes, ", but the pieces fill ", at));
  rr.pieces = pieces;
  return rr;
}

}  // namespace ft::ckpt
