#include "train/plan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "core/error.h"
#include "parallel/partition.h"
#include "runtime/cuda/attention_gemm.h"

namespace ft {
namespace {

constexpr int64_t kF32 = 4;  // bytes of an fp32 element: master weights, gradients, moments

// 1234567 -> "1,234,567"
std::string count(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

// One flat parameter group as a rank holds it (after the tensor split, before ZeRO).
struct Group {
  enum Kind { kEmbed, kLayer, kHead } kind;
  int64_t n = 0;  // elements
  int64_t s = 0;  // ZeRO shard: ⌈n / D⌉
  int64_t own = 0;  // elements of the shard this data rank owns (AdamW state)
  int gathers = 0;  // ZeRO-3 all-gathers per micro-batch
  int64_t count = 1;  // identical groups this entry stands for (a stage's layers: one entry, so
                      // that a plan of 10^9 layers is arithmetic, not 10^9 entries)
};

std::string layer_range(int first, int n) {
  return n == 1 ? "layer " + std::to_string(first)
                : "layers " + std::to_string(first) + "-" + std::to_string(first + n - 1);
}

// The CUDA ops' scratch requests (kernels/cuda/kernels_cuda.h *_scratch_bytes, which these
// follow): RMSNorm's backward keeps per-block partial dw rows, min(N, 512) × C fp32
// (rmsnorm.cu kBackwardBlocks); the cross-entropy one double per row; sum_squares one double
// per block, ⌈n / 2048⌉ blocks, at most 1024 (reduce.cu).
int64_t cuda_rmsnorm_scratch(int64_t N, int64_t C) { return 4 * std::min<int64_t>(N, 512) * C; }
int64_t cuda_ce_scratch(int64_t N) { return 8 * N; }
int64_t cuda_sum_squares_scratch(int64_t n) {
  return n <= 0 ? 0 : 8 * std::min<int64_t>((n + 2047) / 2048, 1024);
}

}  // namespace

int64_t plan_lt_workspace_bytes(int sm) { return sm >= 90 ? int64_t{32} << 20 : int64_t{4} << 20; }

std::string format_rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

MemoryPlan plan_memory(const Recipe& r, int world, const PlanDevice& device) {
  const ModelConfig& m = r.model;
  MemoryPlan plan;
  plan.world = world;
  plan.device = device;
  const bool cuda = device.cuda;
  plan.tensor = r.parallel.tensor;
  plan.pipeline = r.parallel.pipeline;
  plan.zero_stage = r.parallel.zero_stage;
  FT_CHECK(world > 0 && plan.tensor > 0 && plan.pipeline > 0 &&
               world % (plan.tensor * plan.pipeline) == 0,
           "world size ", world, " is not divisible by tensor × pipeline = ",
           plan.tensor * plan.pipeline);
  plan.data = world / (plan.tensor * plan.pipeline);
  plan.micro_batch = r.training.micro_batch_size;
  plan.seq_len = r.data.seq_len;
  plan.accum = grad_accum_steps(r, world);
  plan.activation_checkpointing = r.training.activation_checkpointing;
  const int64_t D = plan.data, P = plan.pipeline, T = plan.tensor, M = plan.accum;
  const int64_t B = plan.micro_batch, S = plan.seq_len, N = B * S;
  const int64_t C = m.dim, H = m.n_heads, KV = m.n_kv_heads, F = m.ffn_dim, V = m.vocab_size;
  const int64_t L = m.n_layers, hd = C / H;
  FT_CHECK(H % T == 0 && KV % T == 0 && F % T == 0 && V % T == 0,
           "heads, KV heads, ffn_dim and vocab_size must split over ", T, " tensor ranks");
  FT_CHECK(L >= P, "pipeline ", P, " stages for only ", L, " layers");
  const int64_t Ht = H / T, HDt = Ht * hd, KDt = (KV / T) * hd, Ft = F / T, Vt = V / T;
  const bool tied = m.tie_embeddings;
  const int zs = plan.zero_stage;
  const bool ckpt = plan.activation_checkpointing;

  // Group sizes per tensor rank (layout.h order; Megatron split). With tied embeddings the head
  // group is the final norm alone: the lm_head is the embedding group, which the last stage then
  // holds as well as the first (LlamaModel::owns_group).
  const int64_t n_embed = Vt * C;
  const int64_t n_layer = 2 * C + 2 * HDt * C + 2 * KDt * C + 3 * Ft * C;
  const int64_t n_head = C + (tied ? 0 : Vt * C);
  plan.model_params = V * C + L * (2 * C + 2 * H * hd * C + 2 * KV * hd * C + 3 * F * C) + C +
                      (tied ? 0 : V * C);

  // Activation elements of one slot (LlamaModel::ensure_acts, split per tensor rank).
  // Attention keeps only its per-row logsumexp (B·(H/T)·S fp32), not the (S, S) probabilities;
  // its fp32 backward's scratch is Δ, B·(H/T)·S (kernels::attention_backward_scratch_elems).
  // The precision policy (DESIGN.md §5): activations and the parameters' compute copy take cb
  // bytes an element (4 fp32, 2 bf16/fp16); statistics (RMSNorm rstd, attention logsumexp and
  // backward scratch, cross-entropy) and everything of the optimizer stay fp32.
  const std::string& prec = r.training.precision;
  const int64_t cb = prec == "fp32" ? 4 : 2;
  const bool mixed = cb != 4;
  // Per slot, compute-dtype elements (…_c) and fp32 elements (…_f).
  const int64_t a_layer_c = 3 * N * C + 2 * N * HDt + 2 * N * KDt + 3 * N * Ft;
  const int64_t a_layer_f = 2 * N + B * Ht * S;  // rstd ×2, lse
  const int64_t a_head_c = N * C + N * Vt, a_head_f = N;
  const int64_t a_bwd_c = 2 * N * C + 2 * N * HDt + 2 * N * KDt + 3 * N * Ft;
  // attention_backward's scratch: Δ (B, H, T), and on the CPU with a 16-bit dtype dQ's fp32
  // accumulator (the CUDA kernel sums dQ in registers: Δ only, attention.cu).
  const int64_t a_bwd_f = B * Ht * S + (mixed && !cuda ? N * HDt : 0);
  const int64_t a_layer = a_layer_c + a_layer_f, a_head = a_head_c + a_head_f;
  const int64_t a_bwd = a_bwd_c + a_bwd_f;
  // Tensor parallelism, on every stage: a row-parallel layer's partial output (N·C), the
  // vocabulary-parallel cross-entropy's row max (N f32), sum-exp and target logit (N f64 each).
  // With a 16-bit dtype, also the fp32 copy its all-reduces sum in (N·C).
  const int64_t a_tp_c = T > 1 ? N * C : 0;
  const int64_t a_tp_f = T > 1 ? 5 * N + (mixed ? N * C : 0) : 0;
  const int64_t a_tp = a_tp_c + a_tp_f;

  auto all_reduce = [&](int64_t bytes, int64_t ranks) { return 2 * (ranks - 1) * bytes / ranks; };
  const std::string mbs = std::to_string(M) + (M == 1 ? " micro-batch" : " micro-batches");

  for (int rank = 0; rank < world; ++rank) {
    RankPlan rp;
    rp.rank = rank;
    rp.tensor_rank = int(rank % T);
    rp.stage = int((rank / T) % P);
    rp.data_rank = int(rank / (T * P));
    const int64_t p = rp.stage, d = rp.data_rank;
    // The split the pipeline runs (stage_layers, lib/parallel/partition.h).
    const LayerRange layers = stage_layers(int(L), int(p), int(P));
    const int64_t Lp = layers.size();
    rp.first_layer = layers.first;
    rp.num_layers = int(Lp);
    rp.embed = p == 0;
    rp.head = p == P - 1;
    const bool holds_embed = rp.embed || (tied && rp.head);
    const bool tied_head = tied && rp.head;               // the head reads the embedding group
    const bool tied_local = tied && rp.embed && rp.head;  // ... which this stage also embeds with

    // Groups this rank holds, with ZeRO shards over the D data ranks and the all-gathers ZeRO-3
    // makes of each per micro-batch: a layer in its forward and backward (and the recompute with
    // activation checkpointing), the head in the forward and backward halves, the embedding in
    // the embedding's forward and, tied, again in both halves of the head.
    std::vector<Group> groups;
    auto add = [&](Group::Kind k, int64_t n, int gathers, int64_t count = 1) {
      // The shards ZeRO cuts (zero_shard, lib/parallel/partition.h).
      Group g{k, n, int64_t(zero_shard_size(size_t(n), int(D))), 0, gathers, count};
      g.own = int64_t(zero_shard(size_t(n), int(D), int(d)).size());
      groups.push_back(g);
    };
    if (holds_embed) add(Group::kEmbed, n_embed, (rp.embed ? 1 : 0) + (tied_head ? 2 : 0));
    if (Lp > 0) add(Group::kLayer, n_layer, ckpt ? 3 : 2, Lp);
    if (rp.head) add(Group::kHead, n_head, 2);

    int64_t sum_n = 0, sum_s = 0, sum_own = 0, max_s = 0, sum_gather = 0;
    for (const Group& g : groups) {
      sum_n += g.count * g.n;
      sum_s += g.count * g.s;
      sum_own += g.count * g.own;
      max_s = std::max(max_s, g.s);
      sum_gather += g.count * g.gathers * g.s;
    }
    rp.param_elems = sum_n;
    {
      std::string h;
      if (holds_embed) {
        h += "embedding " + count(n_embed);
        if (!rp.embed) h += " (the tied lm_head, also held by the first stage)";
        h += " + ";
      }
      h += layer_range(rp.first_layer, int(Lp)) + " (" + std::to_string(Lp) + " × " +
           count(n_layer) + ")";
      if (rp.head) h += std::string(tied ? " + final norm " : " + norm and lm_head ") + count(n_head);
      if (tied_local) h += " (lm_head tied to the embedding)";
      rp.holds = h + " = " + count(sum_n) + " elements";
    }

    // Parameters, gradients, optimizer state.
    const std::string Ds = std::to_string(D);
    if (!mixed && zs >= 3)
      rp.params = {kF32 * sum_s, "4 B × " + count(sum_s) + " (own shards, Σ ⌈n_g/" + Ds + "⌉)"};
    else if (!mixed)
      rp.params = {kF32 * sum_n, "4 B × " + count(sum_n) + " (every element held)"};
    else if (zs >= 3)  // fp32 master shards and their compute copy, both padded to s
      rp.params = {(kF32 + cb) * sum_s, "(4 + " + std::to_string(cb) + ") B × " + count(sum_s) +
                                            " (fp32 master shards and their " + prec +
                                            " copy, Σ ⌈n_g/" + Ds + "⌉)"};
    else if (zs >= 1)  // fp32 masters of the owned ranges; the compute copy of everything
      rp.params = {kF32 * sum_own + cb * sum_n,
                   "4 B × " + count(sum_own) + " fp32 masters of the owned ranges + " +
                       std::to_string(cb) + " B × " + count(sum_n) + " " + prec + " copy"};
    else
      rp.params = {(kF32 + cb) * sum_n, "(4 + " + std::to_string(cb) + ") B × " + count(sum_n) +
                                            " (fp32 masters and their " + prec + " copy)"};
    if (zs >= 2)
      rp.grads = {kF32 * sum_s, "4 B × " + count(sum_s) + " (own shards, Σ ⌈n_g/" + Ds + "⌉)"};
    else
      rp.grads = {kF32 * sum_n, "4 B × " + count(sum_n) + " (full gradients)"};
    if (zs >= 1)
      rp.optim = {2 * kF32 * sum_own,
                  "2 × 4 B × " + count(sum_own) + " (AdamW m and v of the owned ranges)"};
    else
      rp.optim = {2 * kF32 * sum_n, "2 × 4 B × " + count(sum_n) + " (AdamW m and v of everything)"};

    // Activations: one full slot per micro-batch in flight (PipelineSchedule::train_step: 1F1B
    // uses min(P − p, M) slots on stage p; one without pipeline parallelism), each with the
    // stage's residual stream, its layers' sets (one with checkpointing), the head's buffers on
    // the last stage, and its own backward scratch.
    rp.slots = int(std::min(P - p, M));
    const int64_t nsets = ckpt ? 1 : Lp;
    const int64_t resid = (Lp + 1) * N * C;
    const int64_t head_acts = rp.head ? a_head : 0;
    const int64_t per_slot = resid + nsets * a_layer + head_acts + a_tp + a_bwd;
    const int64_t per_slot_f = nsets * a_layer_f + (rp.head ? a_head_f : 0) + a_tp_f + a_bwd_f;
    const int64_t per_slot_c = per_slot - per_slot_f;
    // The micro-batch on the device: token ids (first stage), targets and mask (last stage).
    const int64_t ids_bytes = (rp.embed ? 4 * N : 0) + (rp.head ? 5 * N : 0);
    {
      std::string h = "4 B × ";
      if (P > 1)
        h += std::to_string(rp.slots) + (rp.slots == 1 ? " slot" : " slots") + " (micro-batches in flight) × ";
      h += "(" + count(resid) + " residual stream + " +
           (ckpt ? "one recomputed layer " + count(a_layer)
                 : std::to_string(Lp) + (Lp == 1 ? " layer × " : " layers × ") + count(a_layer));
      if (rp.head) h += " + " + count(a_head) + " final norm, logits";
      if (T > 1) h += " + " + count(a_tp) + " row-parallel partial output, cross-entropy statistics";
      h += " + " + count(a_bwd) + " backward scratch)";
      if (mixed)
        h += "; " + std::to_string(cb) + " B for the " + count(per_slot_c) + " " + prec +
             " elements of a slot, 4 B for its " + count(per_slot_f) +
             " fp32 ones (norm statistics, attention logsumexp and scratch)";
      rp.activations = {rp.slots * (cb * per_slot_c + kF32 * per_slot_f + ids_bytes), h};
    }

    // Communication buffers on the device. ZeRO: the persistent all-gather buffer of stages 1/2,
    // and the largest set of transient gathered parameters / working gradients. Pipeline: a
    // receive buffer and one send buffer per micro-batch (PipelineSchedule), N·C each.
    const int64_t persistent = (zs == 1 || zs == 2) && D > 1 ? D * max_s : 0;
    const int64_t pipe_bufs = P > 1 ? (M + 1) * N * C : 0;
    // Transient buffers in bytes: gathered parameters are in the compute dtype (cb), working
    // gradients and reduce-scatter results fp32.
    int64_t transient_bytes = 0;
    std::string worst;
    auto phase = [&](int64_t bytes, const std::string& what) {
      if (bytes > transient_bytes) {
        transient_bytes = bytes;
        worst = what;
      }
    };
    const Group* ge = holds_embed ? &groups.front() : nullptr;
    const Group* gh = rp.head ? &groups.back() : nullptr;
    const int64_t We = ge ? D * ge->s : 0;
    const int64_t sl = int64_t(zero_shard_size(size_t(n_layer), int(D))), Wl = D * sl;
    // One stage with tied embeddings: the embedding's working gradient, opened by the head's
    // backward, stays until the embedding's own. On the last of several stages it is complete
    // (reduce-scattered) at the end of the head's backward.
    const int64_t hold = zs >= 2 && tied_local ? We : 0;
    if (zs == 2) {
      // A group's working gradient (D·s) lives through its backward; the reduce-scatter result
      // (s) is allocated before it is freed.
      const std::string hs = tied_local ? " + the tied embedding's working gradient" : "";
      if (gh) phase(kF32 * (D * gh->s + gh->s + (tied_head ? We : 0)),
                    "the head's working gradient + its reduce-scatter result" +
                        std::string(tied_head ? " + the tied embedding's working gradient" : ""));
      phase(kF32 * (Wl + sl + hold),
            "a layer's working gradient + its reduce-scatter result" + hs);
      if (ge) phase(kF32 * (We + ge->s),
                    "the embedding's working gradient + its reduce-scatter result");
    } else if (zs == 3) {
      // Gathered parameters (D·s) of the group running; in backward also its working gradient.
      if (rp.embed) phase(cb * We, "the gathered embedding");
      if (gh) phase((cb + kF32) * (D * gh->s + (tied_head ? We : 0)),
                    "the gathered head + its working gradient" +
                        std::string(tied_head ? " + the tied embedding gathered and its working gradient" : ""));
      phase((cb + kF32) * Wl + kF32 * hold,
            "a gathered layer + its working gradient" +
                std::string(tied_local ? " + the tied embedding's working gradient" : ""));
      if (ge) phase(kF32 * (We + ge->s),
                    "the embedding's working gradient + its reduce-scatter result");
    }
    {
      std::string h;
      if (persistent == 0 && transient_bytes == 0 && pipe_bufs == 0) {
        h = zs == 0 ? "none: gradients are all-reduced in place" : "none: one data rank";
      } else {
        const std::string cbs = std::to_string(cb) + " B × ";
        std::vector<std::string> parts;
        if (persistent)
          parts.push_back(cbs + count(persistent) + " all-gather buffer (" + Ds + " × max_g ⌈n_g/" +
                          Ds + "⌉)");
        if (transient_bytes)
          parts.push_back(count(transient_bytes) + " B at most at once (" + worst + ")");
        if (pipe_bufs)
          parts.push_back(cbs + count(pipe_bufs) + " pipeline buffers (a receive buffer and " +
                          std::to_string(M) + " send buffers of N·C)");
        for (size_t i = 0; i < parts.size(); ++i) h += (i ? " + " : "") + parts[i];
      }
      rp.comm_buffers = {cb * (persistent + pipe_bufs) + transient_bytes, h};
    }

    // The CUDA backend's own buffers (cuda_ops.cpp): the cuBLASLt workspace, allocated with the
    // device, and one scratch buffer the ops share, grown on demand to max(asked, 2 × held):
    // in a step the cross-entropy asks first (last stage), then RMSNorm's backward, then the
    // gradient norm's sum_squares over a group at most.
    int64_t lt_ws = 0;
    if (cuda) {
      lt_ws = plan_lt_workspace_bytes(device.sm);
      int64_t scratch = 0, max_n = 0;
      for (const Group& g : groups) max_n = std::max(max_n, g.n);
      // Attention on tensor cores asks for its chunks in each layer's forward (first in a step)
      // and backward (after the MLP norm's): attention_gemm.h.
      int64_t attn_fwd = 0, attn_bwd = 0;
      if (device.attention_gemm && Lp > 0) {
        const DType dt = prec == "fp32" ? DType::kF32 : prec == "bf16" ? DType::kBF16
                                                                       : DType::kF16;
        const int Kt = int(KV / T), Htr = int(Ht);
        const cuda::AttentionGemmPlan ap =
            cuda::attention_gemm_plan(int(B), int(S), Kt, Htr / Kt, dt);
        attn_fwd = int64_t(cuda::attention_gemm_scratch_bytes(int(B), int(S), Htr, Kt, int(hd),
                                                              dt, ap, false));
        attn_bwd = int64_t(cuda::attention_gemm_scratch_bytes(int(B), int(S), Htr, Kt, int(hd),
                                                              dt, ap, true));
      }
      const int64_t asks[] = {attn_fwd, rp.head ? cuda_ce_scratch(N) : 0,
                              cuda_rmsnorm_scratch(N, C), attn_bwd,
                              cuda_sum_squares_scratch(max_n)};
      for (int64_t a : asks)
        if (a > scratch) scratch = std::max(a, 2 * scratch);
      char sm[16];
      std::snprintf(sm, sizeof sm, "sm_%d", device.sm);
      rp.backend = {lt_ws + scratch,
                    count(lt_ws) + " B cuBLASLt workspace (" + sm + ") + " + count(scratch) +
                        " B ops scratch (" +
                        (attn_bwd ? "attention on tensor cores: head-major copies and score chunks, " : "") +
                        "RMSNorm backward partials, cross-entropy rows, sum-of-squares partials)"};
    } else {
      rp.backend = {0, "none: the CPU backend allocates nothing of its own"};
    }

    rp.total_bytes = rp.params.bytes + rp.grads.bytes + rp.optim.bytes + rp.activations.bytes +
                     rp.comm_buffers.bytes + rp.backend.bytes;
    // Startup transients: with T > 1 or P > 1 the whole model is initialised once on every rank
    // and sliced; ZeRO-3 holds the full parameters and both shard sets until it drops the former.
    const int64_t slicing = T > 1 || P > 1 ? kF32 * (plan.model_params + sum_n) : 0;
    // ZeRO-3: the full fp32 parameters, the gradient shards and the fp32 master shards (and with
    // a 16-bit dtype their compute copy) before the full parameters are dropped.
    const int64_t sharding = zs == 3 ? kF32 * (sum_n + 2 * sum_s) + (mixed ? cb * sum_s : 0) : 0;
    // 16-bit dtype at stages 0-2: the full fp32 parameters, the gradients, the fp32 masters,
    // while the compute copy is made group by group (each fp32 group freed once converted).
    int64_t max_n = 0;
    for (const Group& g : groups) max_n = std::max(max_n, g.n);
    const int64_t converting =
        mixed && zs < 3
            ? kF32 * sum_n + rp.grads.bytes + kF32 * (zs == 0 ? sum_n : sum_own) + cb * max_n
            : 0;
    // The cuBLASLt workspace exists from the device's creation, so before the first step too.
    rp.startup_bytes = std::max({slicing, sharding, converting});
    if (rp.startup_bytes > 0) rp.startup_bytes += lt_ws;
    if (slicing >= sharding && slicing > 0)
      rp.startup_how = "4 B × (" + count(plan.model_params) + " whole model + " + count(sum_n) +
                       " this rank's part), while the whole model is initialised and sliced";
    else if (sharding >= converting && sharding > 0)
      rp.startup_how = "4 B × (" + count(sum_n) + " full + 2 × " + count(sum_s) + " shards)" +
                       (mixed ? " + " + std::to_string(cb) + " B × " + count(sum_s) : "") +
                       ", while ZeRO-3 shards the parameters";
    else if (converting > 0)
      rp.startup_how = "fp32 parameters, gradients and masters + one group's " + prec +
                       " copy, while the compute copy is made";
    if (lt_ws > 0 && !rp.startup_how.empty()) rp.startup_how += ", + the cuBLASLt workspace";
    rp.peak_bytes = std::max(rp.total_bytes, rp.startup_bytes);

    // Bytes sent per step.
    if (D > 1) {
      // Gradients move in fp32; parameters (all-gathers) in the compute dtype (cb bytes).
      const int64_t full = kF32 * sum_n, shards = kF32 * sum_s, pshards = cb * sum_s;
      const std::string f = "(" + Ds + "−1)";
      if (zs <= 1) {
        int64_t b = all_reduce(full, D);
        std::string h = "all-reduce of the gradients, 2·" + f + "/" + Ds + " × " + count(full) + " B";
        if (zs == 1) {
          b += (D - 1) * pshards;
          h += " + all-gather of the updated parameters, " + f + " × " + count(pshards) + " B";
        }
        rp.sent_data = {b, h};
      } else if (zs == 2) {
        rp.sent_data = {M * (D - 1) * shards + (D - 1) * pshards,
                        mbs + " × reduce-scatter " + f + " × " +
                            count(shards) + " B + all-gather of the updated parameters " + f +
                            " × " + count(pshards) + " B"};
      } else {
        std::string k;
        if (ge) k += "embedding " + std::to_string(ge->gathers) + "×, ";
        k += std::string("each layer ") + (ckpt ? "3× (forward, recompute, backward)" : "2× (forward, backward)");
        if (gh) k += ", head 2×";
        rp.sent_data = {M * (D - 1) * shards + M * (D - 1) * cb * sum_gather,
                        mbs + " × (reduce-scatter " + f + " × " + count(shards) +
                            " B + all-gathers " + f + " × " + count(cb * sum_gather) + " B: " +
                            k + ")"};
      }
    } else {
      rp.sent_data = {0, "one data rank"};
    }
    if (T > 1) {
      // Per layer: two row-parallel outputs in forward (again in the recompute with activation
      // checkpointing) and two column-parallel input gradients in backward.
      const int64_t per_mb_ar = (ckpt ? 6 : 4) * Lp + (rp.embed ? 1 : 0) + (rp.head ? 1 : 0);
      const int64_t ce = rp.head ? all_reduce(kF32 * N, T) + 2 * all_reduce(8 * N, T) : 0;
      const int64_t b = M * (per_mb_ar * all_reduce(kF32 * N * C, T) + ce);
      std::string h = mbs + " × (" +
                      std::to_string(per_mb_ar) + " all-reduces × 2·(" + std::to_string(T) +
                      "−1)/" + std::to_string(T) + " × " + count(kF32 * N * C) + " B";
      if (rp.head)
        h += " + cross-entropy all-reduces of " + count(kF32 * N) + " B (max) and 2 × " +
             count(8 * N) + " B (f64 sums)";
      rp.sent_tensor = {b, h + ")"};
    } else {
      rp.sent_tensor = {0, "one tensor rank"};
    }
    if (P > 1) {
      const int64_t dirs = (p < P - 1 ? 1 : 0) + (p > 0 ? 1 : 0);
      int64_t b = M * dirs * cb * N * C;  // activations travel in the compute dtype
      std::string h = mbs + " × " + count(cb * N * C) + " B (" +
                      (p < P - 1 ? "activations to the next stage" : "") + (dirs == 2 ? ", " : "") +
                      (p > 0 ? "gradients to the previous stage" : "") + ")";
      if (tied && ge) {
        // ZeroSharding::reduce_shared_groups: the full gradient, or with ZeRO ≥ 2 the shard,
        // all-reduced by the two holders (a ring of two sends it once).
        const int64_t e = kF32 * (zs >= 2 ? ge->s : ge->n);
        b += e;
        h += " + tied-embedding gradient all-reduce with the " +
             std::string(rp.embed ? "last" : "first") + " stage, " + count(e) + " B";
      }
      // The step's loss and the gradient norm's sum of squares, one f64 each over the stages.
      const int64_t scalars = 2 * all_reduce(8, P);
      b += scalars;
      h += " + loss and gradient-norm all-reduces, 2 × 2·(" + std::to_string(P) + "−1)/" +
           std::to_string(P) + " × 8 B";
      rp.sent_pipeline = {b, h};
    } else {
      rp.sent_pipeline = {0, "one pipeline stage"};
    }
    rp.sent_bytes = rp.sent_data.bytes + rp.sent_tensor.bytes + rp.sent_pipeline.bytes;
    plan.ranks.push_back(std::move(rp));
  }

  // The symbols the formulas use, with this recipe's values.
  auto str = [](int64_t v) { return std::to_string(v); };
  plan.symbols = {
      "B = " + str(B) + " (micro_batch_size), S = " + str(S) + " (seq_len), N = B·S = " + count(N) +
          " tokens per micro-batch",
      "C = " + str(C) + ", H = " + str(H) + ", KV = " + str(KV) + ", hd = C/H = " + str(hd) +
          ", F = " + str(F) + ", V = " + str(V) + ", L = " + str(L) + " layers" +
          (tied ? ", tied embeddings" : ""),
      "D = " + str(D) + " data, P = " + str(P) + " pipeline, T = " + str(T) +
          " tensor ranks; M = " + str(M) + " micro-batch" + (M == 1 ? "" : "es") +
          " per step per data rank",
      "n_g: elements of parameter group g held by the rank; s_g = ⌈n_g/D⌉ its ZeRO shard",
      "p: the rank's pipeline stage, L_p its layers (L/P, one more on the first L mod P stages); "
      "m = min(P − p, M) activation slots, the micro-batches 1F1B keeps in flight (1 when P = 1)",
  };

  // The formulas, for this ZeRO stage.
  auto& fm = plan.formulas;
  fm.push_back({"groups", "n_embed = (V/T)·C (first stage; with tied embeddings also the last, "
                          "whose lm_head it is); n_layer = 2·C + 2·(H/T)·hd·C + 2·(KV/T)·hd·C + "
                          "3·(F/T)·C; n_head = C + (V/T)·C (last stage; only C, the final norm, "
                          "when embeddings are tied)"});
  fm.push_back({"parameters", zs >= 3 ? "4 B · Σ_g s_g (own shard; a group is gathered to D·s_g only while it runs)"
                                      : "4 B · Σ_g n_g"});
  fm.push_back({"gradients", zs >= 2 ? "4 B · Σ_g s_g (own shard; each micro-batch's group gradient is "
                                       "reduce-scattered into it)"
                                     : "4 B · Σ_g n_g (all-reduced after the last micro-batch)"});
  fm.push_back({"optimizer", zs >= 1 ? "2 · 4 B · Σ_g |[d·s_g, min(n_g, (d+1)·s_g))| (AdamW m and v of "
                                       "data rank d's owned range; the last ranks may own less)"
                                     : "2 · 4 B · Σ_g n_g (AdamW m and v)"});
  fm.push_back({"activations",
                ckpt ? "4 B · m · [(L_p+1)·N·C + A_layer + [last]·A_head + A_tp + A_bwd] (each slot: "
                       "the stage's layer inputs and output, one layer recomputed at a time, its own "
                       "backward scratch)"
                     : "4 B · m · [(L_p+1)·N·C + L_p·A_layer + [last]·A_head + A_tp + A_bwd] (each "
                       "slot: the stage's residual stream, its layers' activations, its own backward "
                       "scratch)"});
  fm.push_back({"A_layer", "3·N·C + 2·N + 2·N·(H/T)·hd + 2·N·(KV/T)·hd + B·(H/T)·S + 3·N·(F/T) "
                           "(ln1, mid, ln2; two rstd; q, att; k, v; attention logsumexp; gate, "
                           "up, silu(gate)·up)"});
  fm.push_back({"A_head", "N·C + N + N·(V/T) on the last stage (final norm, its rstd, logits)"});
  if (T > 1)
    fm.push_back({"A_tp", "N·C + 5·N when T > 1, on every stage (a row-parallel layer's partial "
                          "output before its all-reduce; the cross-entropy's row max f32, sum-exp "
                          "and target logit f64)"});
  fm.push_back({"A_bwd", "2·N·C + 2·N·(H/T)·hd + 2·N·(KV/T)·hd + 3·N·(F/T) + B·(H/T)·S "
                         "(backward scratch; the last: attention's rowsum(dO ∘ O))" +
                             std::string(mixed && !cuda ? " + N·(H/T)·hd fp32 (the CPU "
                                                          "attention's dQ accumulator)"
                                                        : "")});
  const char* comm_formula[] = {
      "0 (gradients all-reduced in place)",
      "4 B · D·max_g s_g (all-gather buffer for the updated parameters; 0 when D = 1)",
      "4 B · [D·max_g s_g + max_g (D·s_g + s_g)] (all-gather buffer + a group's full working "
      "gradient and its reduce-scatter result; tied: + D·s_embed during the head's backward, and "
      "on a single stage until the embedding's backward, the embedding's gradient being open)",
      "4 B · max over the step of the gathered groups and working gradients alive at once: a "
      "layer or the head in backward 2·D·s_g (tied: the head's backward + the embedding gathered "
      "and its working gradient 2·D·s_embed; on a single stage that working gradient stays open "
      "through the layers' backward), the embedding's backward D·s_embed + s_embed"};
  fm.push_back({"comm buffers",
                std::string(comm_formula[zs]) +
                    (P > 1 ? " + 4 B · (M+1)·N·C (PipelineSchedule's receive buffer and one send "
                             "buffer per micro-batch)"
                           : "")});
  if (cuda)
    fm.push_back({"cuda backend", "cuBLASLt workspace (32 MiB from sm_90, 4 MiB before) + the "
                                  "ops' one scratch buffer, grown to max(asked, 2 × held) as the "
                                  "step asks: last stage 8 B·N (cross-entropy rows), then "
                                  "4 B·min(N, 512)·C (RMSNorm backward partials), then "
                                  "8 B·min(⌈max_g n_g/2048⌉, 1024) (sum-of-squares partials)"});
  fm.push_back({"total", std::string("parameters + gradients + optimizer + activations + comm "
                                     "buffers") +
                             (cuda ? " + cuda backend" : "") +
                             " (all alive together in a step's backward)"});
  if (zs == 3 || T > 1 || P > 1)
    fm.push_back({"startup", "max(T > 1 or P > 1: 4 B · (whole model + Σ_g n_g), the whole model "
                             "initialised on every rank and sliced; ZeRO-3: 4 B · (Σ_g n_g + 2·Σ_g s_g), "
                             "the full parameters kept until both shard sets exist); peak = max(total, "
                             "startup)"});
  const char* data_formula[] = {
      "2·(D−1)/D · 4 B·Σ_g n_g (ring all-reduce of the gradients, once per step)",
      "2·(D−1)/D · 4 B·Σ_g n_g + (D−1) · 4 B·Σ_g s_g (gradient all-reduce + parameter all-gather)",
      "M·(D−1) · 4 B·Σ_g s_g + (D−1) · 4 B·Σ_g s_g (per micro-batch reduce-scatter of each group's "
      "gradient + parameter all-gather after the update)",
      "M·(D−1) · 4 B·Σ_g s_g + M·(D−1) · 4 B·Σ_g k_g·s_g (reduce-scatters + all-gathers per "
      "micro-batch: k = 2 for a layer (forward, backward), 3 with activation checkpointing; 2 for "
      "the head (its forward and backward halves); 1 for the embedding on the first stage, + 2 "
      "where the tied lm_head reads it)"};
  if (D > 1) fm.push_back({"sent, data", data_formula[zs]});
  if (T > 1) fm.push_back({"sent, tensor", "M · [(k·L_p + [first] + [last]) · R(4 B·N·C) + [last]·(R(4 B·N) + "
                                "2·R(8 B·N))], R(b) = 2·(T−1)/T·b (ring all-reduce); k = 4 per layer: "
                                "two in forward (o and down outputs) and two in backward (QKV and "
                                "gate/up input gradients), k = 6 with activation checkpointing (the "
                                "recompute repeats the forward's); the vocabulary-parallel embedding; "
                                "the lm_head input gradient; the cross-entropy's row max (f32), "
                                "sum-exp and target logit (f64)"});
  if (P > 1) fm.push_back({"sent, pipeline", "M · 4 B·N·C · ([p < P−1] activations forward + [p > 0] "
                                             "gradients backward) + [tied, first or last stage] "
                                             "4 B·n_embed (4 B·s_embed with ZeRO ≥ 2): the embedding "
                                             "gradient all-reduced between its two holders + "
                                             "2·R_P(8 B): the loss and the gradient norm over the "
                                             "stages, R_P(b) = 2·(P−1)/P·b"});

  plan.notes.push_back(
      r.training.precision == "fp32"
          ? std::string("training.precision fp32: 4 bytes per element throughout.")
          : "training.precision " + r.training.precision +
                ": activations and the parameters' compute copy 2 bytes per element; fp32 "
                "master weights, gradients, AdamW moments, norm and attention statistics 4.");
  if (cuda) {
    char sm[64];
    std::snprintf(sm, sizeof sm, "sm_%d", device.sm);
    plan.notes.push_back(
        "Planned for the CUDA device (" + device.why + "), assuming a GPU of " + sm +
        " (ft plan cannot see the GPU; --cuda-sm 80 for an A100: 4 MiB cuBLASLt workspace "
        "instead of 32).");
    plan.notes.push_back(
        "Only the caching allocator's requests are counted, as mem_peak_bytes counts them. "
        "cudaMalloc'd memory (AllocatorStats reserved, what nvidia-smi shows) is above that by "
        "the allocator's rounding: each block to 512 B, small blocks carved from 2 MiB segments, "
        "large ones in segments rounded to 2 MiB; allow 2 MiB per buffer size in use at once, "
        "plus the CUDA context (some hundreds of MiB per GPU, outside both).");
  } else {
    plan.notes.push_back(
        std::string("Planned for the CPU device (") +
        (device.why.empty() ? "runtime.device: cpu" : device.why) +
        "). Only device-allocator memory is counted, as mem_peak_bytes counts it: the data "
        "loader, MPI and the process itself come on top.");
  }
  plan.notes.push_back(P > 1 ? "Scalars sent over the data and tensor groups (token count, loss, "
                               "gradient norm) are left out."
                             : "Scalars sent each step (token count, loss, gradient norm) are left out.");
  {
    // Checkpoints: every rank writes 1/D of the groups it holds, 12 bytes per element (f32
    // parameters + two AdamW moments), at any ZeRO stage; async saves stage that in host memory.
    int64_t largest = 0;
    for (const RankPlan& rp : plan.ranks) largest = std::max(largest, rp.param_elems);
    const int64_t share = 12 * int64_t(zero_shard_size(size_t(largest), int(D)));
    const int64_t whole = 12 * plan.model_params;
    char sizes[96];
    std::snprintf(sizes, sizeof sizes, "%.1f MiB in all, up to %.1f MiB", double(whole) / 1048576.0,
                  double(share) / 1048576.0);
    plan.notes.push_back(detail::concat(
        "A checkpoint holds 12 B per parameter (f32 weights + AdamW moments): ", sizes,
        " written by one rank", r.checkpoint.async
            ? (cuda ? "; checkpoint.async keeps a page-locked host (not device) staging buffer "
                      "of that share per rank."
                    : "; checkpoint.async keeps a host (not device) staging buffer of that share "
                      "per rank.")
            : "."));
  }
  if (P > 1)
    plan.notes.push_back(
        "Evaluation (data.valid) is not planned: with P > 1 it holds one send buffer per "
        "validation micro-batch, global_batch_size / micro_batch_size of them in place of the "
        "step's M (D times as many).");
  return plan;
}

std::vector<std::vector<int>> plan_roles(const MemoryPlan& plan) {
  auto key = [](const RankPlan& r) {
    return std::make_tuple(r.stage, r.first_layer, r.num_layers, r.embed, r.head, r.holds,
                           r.params.bytes, r.params.how, r.grads.bytes, r.grads.how, r.optim.bytes,
                           r.optim.how, r.activations.bytes, r.activations.how,
                           r.comm_buffers.bytes, r.comm_buffers.how, r.startup_bytes,
                           r.sent_data.bytes, r.sent_data.how, r.sent_tensor.bytes,
                           r.sent_tensor.how, r.sent_pipeline.bytes, r.sent_pipeline.how);
  };
  std::vector<std::vector<int>> roles;
  std::map<decltype(key(plan.ranks.front())), size_t> index;
  for (const RankPlan& r : plan.ranks) {
    auto [it, fresh] = index.emplace(key(r), roles.size());
    if (fresh) roles.emplace_back();
    roles[it->second].push_back(r.rank);
  }
  return roles;
}

}  // namespace ft
