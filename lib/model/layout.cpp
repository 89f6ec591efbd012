#include "model/layout.h"

#include "core/error.h"
#include "model/arch.h"

namespace ft {
void add_param(ParamGroup& g, const std::string& name, std::vector<int64_t> shape, int tensor,
               TensorSplit split) {
  ParamEntry e;
  e.name = name;
  e.global_shape = shape;
  e.split = split;
  if (split == TensorSplit::kRows) shape[0] /= tensor;
  if (split == TensorSplit::kCols) shape[1] /= tensor;
  e.shape = std::move(shape);
  e.numel = 1;
  for (auto d : e.shape) e.numel *= size_t(d);
  e.offset = g.numel;
  e.weight_decay = e.shape.size() >= 2;
  g.numel += e.numel;
  g.entries.push_back(std::move(e));
}

ParamLayout::ParamLayout(const ModelConfig& c, int tensor)
    : tensor_(tensor), n_layers_(c.n_layers) {
  const ArchSpec& arch = arch_of(c);
  FT_CHECK(heads_whole(c), "dim must be divisible by n_heads (or head_dim set)");
  FT_CHECK(tensor >= 1 && c.n_heads % tensor == 0 && c.n_kv_heads % tensor == 0 &&
               c.ffn_dim % tensor == 0 && c.vocab_size % tensor == 0,
           "heads, kv heads, ffn_dim and vocab_size must be divisible by parallel.tensor");
  head_dim_ = head_dim_of(c);
  const int T = tensor;
  constexpr auto kRows = TensorSplit::kRows, kCols = TensorSplit::kCols;
  const int64_t C = c.dim, V = c.vocab_size, F = c.ffn_dim;
  const int64_t HD = int64_t(c.n_heads) * head_dim_, KVD = int64_t(c.n_kv_heads) * head_dim_;

  ParamGroup embed{"embed", {}, 0};
  add_param(embed, "model.embed_tokens.weight", {V, C}, T, kRows);
  groups_.push_back(std::move(embed));

  const bool bias = arch.qkv_bias, qk_norm = arch.qk_norm;
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    ParamGroup g{"layers." + std::to_string(i), {}, 0};
    auto at = [&g] { return g.numel; };
    BlockOffsets o;
    o.attn_norm = at();
    add_param(g, p + "input_layernorm.weight", {C});
    o.wq = at();
    add_param(g, p + "self_attn.q_proj.weight", {HD, C}, T, kRows);
    if (bias) {
      o.bq = at();
      add_param(g, p + "self_attn.q_proj.bias", {HD}, T, kRows);
    }
    o.wk = at();
    add_param(g, p + "self_attn.k_proj.weight", {KVD, C}, T, kRows);
    if (bias) {
      o.bk = at();
      add_param(g, p + "self_attn.k_proj.bias", {KVD}, T, kRows);
    }
    o.wv = at();
    add_param(g, p + "self_attn.v_proj.weight", {KVD, C}, T, kRows);
    if (bias) {
      o.bv = at();
      add_param(g, p + "self_attn.v_proj.bias", {KVD}, T, kRows);
    }
    o.wo = at();
    add_param(g, p + "self_attn.o_proj.weight", {C, HD}, T, kCols);
    if (qk_norm) {
      o.q_norm = at();
      add_param(g, p + "self_attn.q_norm.weight", {head_dim_});
      o.k_norm = at();
      add_param(g, p + "self_attn.k_norm.weight", {head_dim_});
    }
    o.mlp_norm = at();
    add_param(g, p + "post_attention_layernorm.weight", {C});
    o.w_gate = at();
    add_param(g, p + "mlp.gate_proj.weight", {F, C}, T, kRows);
    o.w_up = at();
    add_param(g, p + "mlp.up_proj.weight", {F, C}, T, kRows);
    o.w_down = at();
    add_param(g, p + "mlp.down_proj.weight", {C, F}, T, kCols);
    o.total = g.numel;
    if (i == 0) block_offsets_ = o;
    groups_.push_back(std::move(g));
  }

  ParamGroup head{"head", {}, 0};
  add_param(head, "model.norm.weight", {C});
  if (!c.tie_embeddings) add_param(head, "lm_head.weight", {V, C}, T, kRows);
  groups_.push_back(std::move(head));
  attached_.assign(groups_.size(), -1);
  tied_ = c.tie_embeddings;
  locate_head();
}

void ParamLayout::locate_head() {
  auto at = [this](const std::string& name) {
    int g = -1;
    const ParamEntry* e = nullptr;
    FT_CHECK(find(name, &g, &e), "the layout has no ", name);
    return TensorAt{g, e->offset};
  };
  final_norm_ = at("model.norm.weight");
  output_weight_ = at(tied_ ? "model.embed_tokens.weight" : "lm_head.weight");
}

size_t ParamLayout::total_numel() const {
  size_t n = 0;
  for (const auto& g : groups_) n += g.numel;
  return n;
}

bool ParamLayout::find(const std::string& name, int* group, const ParamEntry** entry) const {
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (const auto& e : groups_[gi].entries)
      if (e.name == name) {
        *group = int(gi);
        *entry = &e;
        return true;
      }
  return false;
}

void ParamLayout::set_trainable(int group, bool trainable) {
  FT_CHECK(group >= 0 && size_t(group) < groups_.size(), "no parameter group ", group);
  for (ParamEntry& e : groups_[size_t(group)].entries) e.trainable = trainable;
}

void ParamLayout::set_nf4(int group) {
  FT_CHECK(group >= 0 && size_t(group) < groups_.size(), "no parameter group ", group);
  FT_CHECK(!groups_[size_t(group)].trains(), "group ", groups_[size_t(group)].name,
           " trains: only a frozen group is held in NF4");
  for (ParamEntry& e : groups_[size_t(group)].entries) e.nf4 = e.shape.size() >= 2;
}

int ParamLayout::add_group(ParamGroup group) {
  const int g = int(groups_.size());
  const int to = group.attached_to;
  if (to >= 0) {
    FT_CHECK(to >= 1 && to <= n_layers_, "group ", group.name, " attached to group ", to,
             ", which is not a block");
    FT_CHECK(attached_[size_t(to)] < 0, "group ", group.name, " attached to ",
             groups_[size_t(to)].name, ", which has one already (",
             groups_[size_t(attached_[size_t(to)])].name, ")");
    attached_[size_t(to)] = g;
  }
  groups_.push_back(std::move(group));
  attached_.push_back(-1);
  return g;
}

int ParamLayout::attached_group(int g) const { return attached_[size_t(g)]; }

int ParamLayout::split_off(const std::string& name, const std::string& group_name) {
  int from = -1;
  const ParamEntry* found = nullptr;
  FT_CHECK(find(name, &from, &found), "split_off: the layout has no tensor ", name);
  FT_CHECK(groups_[size_t(from)].attached_to < 0 && groups_[size_t(from)].entries.size() > 1,
           "split_off: ", name, " is alone in its group or an adapter's");
  for (const ParamGroup& g : groups_)
    FT_CHECK(g.attached_to < 0, "split_off after an adapter's group (", g.name, ")");
  ParamGroup& old = groups_[size_t(from)];
  ParamGroup moved{group_name, {}, 0};
  std::vector<ParamEntry> kept;
  old.numel = 0;
  for (ParamEntry& e : old.entries) {
    const bool out = e.name == name;
    ParamGroup& to = out ? moved : old;
    e.offset = to.numel;
    to.numel += e.numel;
    (out ? moved.entries : kept).push_back(std::move(e));
  }
  old.entries = std::move(kept);
  const int g = add_group(std::move(moved));
  locate_head();  // the head's tensors where they now are
  return g;
}

ParamLayout converted_layout(const ModelConfig& cfg, int tensor,
                             const ModelConverters* converters) {
  ParamLayout layout(cfg, tensor);
  if (converters)
    for (const auto& c : *converters) c->convert_layout(layout);
  return layout;
}

}  // namespace ft
