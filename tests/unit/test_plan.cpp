// ft plan's figures (lib/train/plan.h: each rank's setup and one step counted on a counting
// device) against what the code should allocate, worked out by hand on small cases: ZeRO stages
// 0–3 with even and uneven shards, tied embeddings, the tensor split, pipeline stages (uneven
// split, 1F1B activation slots, the tied embedding on the first and last stage, ZeRO with
// pipeline), the CUDA backend's buffers, and the rank layout rank = (d·P + p)·T + t. So a change
// that allocates more or less than the design says shows here even when plan and run agree.
// The last stage's figures are worked out here; rank 0, which writes the metrics, is always on
// the first. tests/cli/test_plan.sh checks the figures against what real runs measure.
#include <doctest/doctest.h>

#include "core/error.h"
#include "model/layout.h"
#include "recipe/recipe.h"
#include "train/plan.h"

using ft::MemoryPlan;
using ft::plan_memory;
using ft::RankPlan;
using ft::Recipe;

namespace {

// C = 8, H = 2 (hd = 4), KV = 1, F = 12, V = 10, L = 2; B = 1, S = 4 (N = 4).
// Groups: embed V·C = 80; layer 2·8 + q 8·8 + k 4·8 + v 4·8 + o 8·8 + 3·12·8 = 496;
// head 8 + 80 = 88 (8 when tied). Total 1160 (1080 tied).
Recipe small(int zero = 0, bool tied = false) {
  Recipe r;
  r.model.dim = 8;
  r.model.n_heads = 2;
  r.model.n_kv_heads = 1;
  r.model.ffn_dim = 12;
  r.model.vocab_size = 10;
  r.model.n_layers = 2;
  r.model.tie_embeddings = tied;
  r.data.seq_len = 4;
  r.training.micro_batch_size = 1;
  r.training.global_batch_size = 1;
  r.parallel.zero_stage = zero;
  // ZeRO-3 prefetch adds the gathered groups ahead of use to the peak; the figures below are
  // worked out without it, and one test case adds it (below).
  r.parallel.prefetch_blocks = 0;
  return r;
}

// Activations of the small model on one rank, elements:
//   A_layer = 3·N·C 96 + 2·N 8 + 2·N·HD 64 + 2·N·KD 32 + attention lse B·H·S 8 + 3·N·F 144
//           = 352
//   kept = (L+1)·N·C 96 + L·A_layer 704 = 800; A_head = 32 + 4 + 40 = 76;
//   A_bwd = 2·N·C 64 + 2·N·HD 64 + 2·N·KD 32 + 3·N·F 144 + attention's Δ B·H·S 8 = 312
constexpr int64_t kActs = 800 + 76 + 312;
// Bytes of the micro-batch on the device per slot (N = 4): token ids on the first stage (4·N),
// targets (4·N) and mask (N) on the last.
constexpr int64_t kIdsFirst = 16, kIdsLast = 20, kIds = kIdsFirst + kIdsLast;
// The step's small buffers, once per rank, counted with the activations: the model's RoPE
// inverse frequencies (head dim 4: 2 floats), loss accumulator (a double) and token weight (a
// float), and ZeRO's gradient-norm accumulator (a double).
constexpr int64_t kScalars = 8 + 8 + 4 + 8;
// AdamW's step constants in device memory: a kernels::AdamwArgs (7 floats) with weight decay and
// one without, counted with the optimizer's state.
constexpr int64_t kAdamwArgs = 2 * 7 * 4;
// Scalars all-reduced over the data group each step, by a ring of 2 (2·(2−1)/2 of 8 B each):
// the target-token count and the loss; with ZeRO ≥ 2 also the gradient norm's sum of squares
// (each rank holds a shard of the gradients).
constexpr int64_t kDataScalars = 8 + 8, kDataScalarsZ2 = kDataScalars + 8;

}  // namespace

TEST_CASE("plan: one rank, no ZeRO: everything full, matching the parameter layout") {
  for (bool tied : {false, true}) {
    const Recipe r = small(0, tied);
    const MemoryPlan p = plan_memory(r, 1);
    REQUIRE(p.ranks.size() == 1);
    const RankPlan& k = p.ranks[0];
    const int64_t n = tied ? 1080 : 1160;
    CHECK(int64_t(ft::ParamLayout(r.model).total_numel()) == n);
    CHECK(p.model_params == n);
    CHECK(k.param_elems == n);
    CHECK(k.params.bytes == 4 * n);
    CHECK(k.grads.bytes == 4 * n);
    CHECK(k.optim.bytes == 8 * n + kAdamwArgs);
    CHECK(k.activations.bytes == 4 * kActs + kIds + kScalars);
    CHECK(k.comm_buffers.bytes == 0);
    CHECK(k.total_bytes == 4 * n + 4 * n + 8 * n + kAdamwArgs + 4 * kActs + kIds + kScalars);
    CHECK(k.peak_bytes == k.total_bytes);
    CHECK(k.sent_bytes == 0);
    CHECK(k.embed);
    CHECK(k.head);
    CHECK(k.num_layers == 2);
  }
}

TEST_CASE("plan: activation checkpointing keeps layer inputs and one recomputed layer") {
  Recipe r = small();
  r.training.activation_checkpointing = true;
  const RankPlan k = plan_memory(r, 1).ranks[0];
  CHECK(k.activations.bytes == 4 * (96 + 352 + 76 + 312) + kIds + kScalars);
}

TEST_CASE("plan: activations are linear in seq_len (attention keeps no (S, S) buffer)") {
  // Every activation term is a multiple of N = B·S or of B·S (the attention logsumexp), so
  // doubling S doubles them exactly; an S² term (the probabilities FlashAttention dropped)
  // would not. The head's logits, (N, V) in one chunk (training.loss_chunk_tokens 0), are one
  // of them; in chunks of the default 1024 tokens they stop growing there: at S = 4096 the
  // plan holds 3072·V logits fewer.
  for (bool ckpt : {false, true}) {
    Recipe r = small();
    r.model.max_seq_len = 4096;
    r.training.activation_checkpointing = ckpt;
    r.training.loss_chunk_tokens = 0;
    auto acts = [&] { return plan_memory(r, 1).ranks[0].activations.bytes - kScalars; };
    const int64_t a4 = acts();
    r.data.seq_len = 8;
    CHECK(acts() == 2 * a4);
    r.data.seq_len = 4096;
    CHECK(acts() == 1024 * a4);
    r.training.loss_chunk_tokens = 1024;
    CHECK(acts() == 1024 * a4 - 4 * (4096 - 1024) * 10);
  }
}

TEST_CASE("plan: ZeRO stages on 2 data ranks (even shards: 40, 248, 248, 44)") {
  // Σ s_g = 580; max s_g = 248; M = 1 micro-batch per step.
  auto plan = [](int z, bool tied = false) {
    Recipe r = small(z, tied);
    r.training.global_batch_size = 2;
    MemoryPlan p = plan_memory(r, 2);
    REQUIRE(p.data == 2);
    REQUIRE(p.accum == 1);
    REQUIRE(ft::plan_roles(p).size() == 1);  // both ranks alike
    return p.ranks[1];
  };
  const RankPlan z0 = plan(0), z1 = plan(1), z2 = plan(2), z3 = plan(3);
  CHECK(z0.params.bytes == 4640);
  CHECK(z0.grads.bytes == 4640);
  CHECK(z0.optim.bytes == 9280 + kAdamwArgs);
  CHECK(z0.comm_buffers.bytes == 0);
  CHECK(z0.sent_data.bytes == 4640 + kDataScalars);  // ring all-reduce: 2·(2−1)/2 × 4640 B

  CHECK(z1.params.bytes == 4640);
  CHECK(z1.grads.bytes == 4640);
  CHECK(z1.optim.bytes == 8 * 580 + kAdamwArgs);
  CHECK(z1.comm_buffers.bytes == 4 * 2 * 248);                 // all-gather buffer D·max s
  CHECK(z1.sent_data.bytes == 4640 + 4 * 580 + kDataScalars);  // + all-gather (D−1)·Σs

  CHECK(z2.params.bytes == 4640);
  CHECK(z2.grads.bytes == 4 * 580);
  CHECK(z2.optim.bytes == 8 * 580 + kAdamwArgs);
  // all-gather buffer 496 + a layer's working gradient 496 and its reduce-scatter result 248
  CHECK(z2.comm_buffers.bytes == 4 * (496 + 496 + 248));
  // reduce-scatter per micro-batch + all-gather
  CHECK(z2.sent_data.bytes == 4 * 580 + 4 * 580 + kDataScalarsZ2);

  CHECK(z3.params.bytes == 4 * 580);
  CHECK(z3.grads.bytes == 4 * 580);
  CHECK(z3.optim.bytes == 8 * 580 + kAdamwArgs);
  CHECK(z3.comm_buffers.bytes == 4 * 2 * 496);  // a gathered layer + its working gradient
  // Before the first step: the full parameters and both shard sets while ZeRO-3 shards them, or
  // the state it then keeps (shards, gradient shards, m and v: also 4·(4·580)), and the scalars.
  CHECK(z3.startup_bytes == 4 * (1160 + 2 * 580) + kAdamwArgs + kScalars);
  CHECK(z3.peak_bytes == std::max(z3.total_bytes, z3.startup_bytes));
  // reduce-scatter Σs + all-gathers: embedding 40 once, layers twice, the head 44 twice (its
  // forward and backward halves)
  CHECK(z3.sent_data.bytes == 4 * 580 + 4 * (40 + 2 * 2 * 248 + 2 * 44) + kDataScalarsZ2);

  // Tied: head = the final norm only (8, shard 4); Σ s = 40 + 496 + 4 = 540.
  const RankPlan t2 = plan(2, true), t3 = plan(3, true);
  CHECK(t2.grads.bytes == 4 * 540);
  // all-gather buffer 496 + a layer's working gradient and result 744 + the embedding's open
  // working gradient 80
  CHECK(t2.comm_buffers.bytes == 4 * (496 + 744 + 80));
  CHECK(t3.params.bytes == 4 * 540);
  // a gathered layer + its working gradient 992 + the tied embedding's working gradient 80
  CHECK(t3.comm_buffers.bytes == 4 * (992 + 80));
  // The embedding is gathered twice: its own forward, and for the tied lm_head in the head's
  // forward, which runs the head's backward too (the backward's half gathers the norm alone).
  CHECK(t3.sent_data.bytes == 4 * 540 + 4 * (2 * 40 + 2 * 2 * 248 + 2 * 4) + kDataScalarsZ2);
}

TEST_CASE("plan: bf16 and fp16: fp32 masters + a 2-byte copy, parameters move at 2 bytes") {
  // The model above on 2 data ranks: n = 1160, Σ s_g = 580, max s_g = 248; owned ranges here
  // equal the shards (even split).
  for (const char* prec : {"bf16", "fp16"}) {
    auto plan = [&](int z) {
      Recipe r = small(z);
      r.training.global_batch_size = 2;
      r.training.precision = prec;
      return plan_memory(r, 2).ranks[1];
    };
    const RankPlan z0 = plan(0), z1 = plan(1), z2 = plan(2), z3 = plan(3);
    CHECK(z0.params.bytes == (4 + 2) * 1160);  // masters of everything + the copy
    CHECK(z0.grads.bytes == 4 * 1160);         // gradients stay fp32
    CHECK(z0.optim.bytes == 8 * 1160 + kAdamwArgs);
    CHECK(z0.sent_data.bytes == 4640 + kDataScalars);  // the fp32 gradient all-reduce
    CHECK(z1.params.bytes == 4 * 580 + 2 * 1160);      // owned masters + the whole copy
    CHECK(z1.comm_buffers.bytes == 2 * 2 * 248);       // the all-gather buffer, in bf16/fp16
    CHECK(z1.sent_data.bytes == 4640 + 2 * 580 + kDataScalars);  // + the all-gather at 2 B
    // fp32 reduce-scatter, 2-byte all-gather
    CHECK(z2.sent_data.bytes == 4 * 580 + 2 * 580 + kDataScalarsZ2);
    CHECK(z3.params.bytes == (4 + 2) * 580);  // master shards + their copy
    // a gathered layer (2 B) + its working gradient (4 B)
    CHECK(z3.comm_buffers.bytes == (2 + 4) * 496);
    CHECK(z3.sent_data.bytes == 4 * 580 + 2 * (40 + 2 * 2 * 248 + 2 * 44) + kDataScalarsZ2);
    // Activations: the compute-dtype elements at 2 B, statistics at 4 B; less than fp32's.
    Recipe r = small(0);
    const RankPlan f32 = plan_memory(r, 1).ranks[0];
    r.training.precision = prec;
    const RankPlan h = plan_memory(r, 1).ranks[0];
    // Of kActs: 16-bit: residual 96 + 2 layers × 336 + head 72 + backward 304 = 1144 elements;
    // fp32: 2 × (two rstd 8 + lse 8) + the final rstd 4 + attention's Δ 8 + its fp32 dQ
    // accumulator N·HD 32 = 76.
    CHECK(h.activations.bytes == 2 * 1144 + 4 * 76 + kIds + kScalars);
    CHECK(f32.activations.bytes == 4 * kActs + kIds + kScalars);
  }
}

TEST_CASE("plan: uneven ZeRO shards on 3 data ranks: the last rank owns less") {
  Recipe r = small(1);
  r.training.global_batch_size = 3;
  const MemoryPlan p = plan_memory(r, 3);
  // s = ⌈80/3⌉ 27, ⌈496/3⌉ 166, ⌈88/3⌉ 30; rank 2 owns 80−54 = 26, 496−332 = 164, 88−60 = 28.
  CHECK(p.ranks[0].optim.bytes == 8 * (27 + 166 + 166 + 30) + kAdamwArgs);
  CHECK(p.ranks[1].optim.bytes == 8 * (27 + 166 + 166 + 30) + kAdamwArgs);
  CHECK(p.ranks[2].optim.bytes == 8 * (26 + 164 + 164 + 28) + kAdamwArgs);
  const auto roles = ft::plan_roles(p);
  REQUIRE(roles.size() == 2);
  CHECK(roles[0] == std::vector<int>{0, 1});
  CHECK(roles[1] == std::vector<int>{2});
  // ZeRO-3 params: padded shards on every rank.
  r.parallel.zero_stage = 3;
  const MemoryPlan p3 = plan_memory(r, 3);
  CHECK(p3.ranks[2].params.bytes == 4 * (27 + 166 + 166 + 30));
}

TEST_CASE("plan: ZeRO-3 prefetch holds the next gathered groups, and sends nothing more") {
  // The small model on 2 data ranks (shards 40, 248, 248, 44: a layer gathered is 2·248 = 496
  // floats). Prefetching one group ahead: a second layer gathered while the first computes;
  // two ahead: no less (here the peak comes where a third group adds nothing).
  auto plan = [](int prefetch) {
    Recipe r = small(3);
    r.training.global_batch_size = 2;
    r.parallel.prefetch_blocks = prefetch;
    return plan_memory(r, 2).ranks[1];
  };
  const RankPlan none = plan(0), one = plan(1), two = plan(2);
  CHECK(one.comm_buffers.bytes == none.comm_buffers.bytes + 4 * 496);
  CHECK(two.comm_buffers.bytes >= one.comm_buffers.bytes);
  CHECK(one.sent_data.bytes == none.sent_data.bytes);  // the same gathers, earlier
  CHECK(two.sent_data.bytes == none.sent_data.bytes);
}

TEST_CASE("plan: tensor split (Megatron): heads, KV heads, MLP and vocabulary over T") {
  Recipe r = small();
  r.model.n_kv_heads = 2;
  r.parallel.tensor = 2;
  const MemoryPlan p = plan_memory(r, 2);
  CHECK(p.data == 1);
  REQUIRE(ft::plan_roles(p).size() == 1);
  const RankPlan& k = p.ranks[1];
  CHECK(k.tensor_rank == 1);
  // embed 5·8 = 40; layer 2·8 + q 4·8 + k 4·8 + v 4·8 + o 8·4 + 3·6·8 = 16 + 128 + 144 = 288;
  // head 8 + 40 = 48: the same as the model's own tensor-rank layout.
  CHECK(k.param_elems == 40 + 2 * 288 + 48);
  CHECK(k.param_elems == int64_t(ft::ParamLayout(r.model, 2).total_numel()));
  CHECK(k.params.bytes == 4 * (40 + 576 + 48));
  // Per tensor rank: HD = KD = 4, H = 1, F = 6, V = 5:
  //   A_layer = 96 + 8 + 32 + 32 + lse 4 + 72 = 244; kept = 96 + 488 = 584;
  //   A_head = 32 + 4 + 20 + cross-entropy statistics 5·4 = 76; A_tp = N·C = 32;
  //   A_bwd = 64 + 32 + 32 + 72 + Δ 4 = 204
  CHECK(k.activations.bytes == 4 * (584 + 76 + 32 + 204) + kIds + kScalars);
  // M = 1: (4 per layer × 2 + embedding + lm_head input gradient) all-reduces of N·C·4 = 128 B,
  // of which a ring sends 2·(2−1)/2; cross-entropy: max 16 B, two f64 sums of 32 B; the
  // gradient norm's sum of squares, 8 B.
  CHECK(k.sent_tensor.bytes == 10 * 128 + 16 + 2 * 32 + 8);
  CHECK(k.sent_data.bytes == 0);
  CHECK(k.sent_pipeline.bytes == 0);
  // Each rank builds only its slices of the model (with KV = 2: layers of 560, 80 + 2·560 + 88
  // = 1288 in all), never the whole: its parameter memory peaks at its share, 4·664, and the
  // start-up's peak is the state at the end of the setup (parameters, gradients, m and v).
  CHECK(p.model_params == 1288);
  CHECK(k.startup_params_bytes == 4 * 664);
  CHECK(k.startup_bytes == 16 * 664 + kAdamwArgs + kScalars);

  // Activation checkpointing: the recompute repeats the forward's two all-reduces per layer.
  r.training.activation_checkpointing = true;
  CHECK(plan_memory(r, 2).ranks[0].sent_tensor.bytes == 14 * 128 + 16 + 2 * 32 + 8);
}

TEST_CASE("plan: uneven pipeline split, 1F1B activation slots, the tied embedding on both ends") {
  Recipe r = small(0, /*tied=*/true);
  r.model.n_layers = 5;
  r.parallel.pipeline = 2;
  r.training.global_batch_size = 4;  // D = 1, M = 4
  const MemoryPlan p = plan_memory(r, 2);
  REQUIRE(p.ranks.size() == 2);
  const RankPlan &s0 = p.ranks[0], &s1 = p.ranks[1];
  CHECK(s0.stage == 0);
  CHECK(s1.stage == 1);
  CHECK(s0.first_layer == 0);
  CHECK(s0.num_layers == 3);  // the first stage takes the extra layer (pipeline_stage)
  CHECK(s1.first_layer == 3);
  CHECK(s1.num_layers == 2);
  CHECK(s0.embed);
  CHECK_FALSE(s0.head);
  CHECK(s1.head);
  CHECK_FALSE(s1.embed);
  CHECK(s0.param_elems == 80 + 3 * 496);
  // The last stage holds the embedding group (its lm_head) and the head group, the final norm.
  CHECK(s1.param_elems == 80 + 2 * 496 + 8);
  CHECK(s1.holds.find("embedding 80") != std::string::npos);
  CHECK(s1.params.bytes == 4 * (80 + 2 * 496 + 8));
  CHECK(s1.optim.bytes == 8 * (80 + 2 * 496 + 8) + kAdamwArgs);
  // Stage 0: min(P − 0, M) = 2 slots, each (3+1)·32 residual + 3·352 layers + 312 backward
  // scratch = 1496; no head.
  CHECK(s0.slots == 2);
  CHECK(s0.activations.bytes == 2 * (4 * 1496 + kIdsFirst) + kScalars);
  // Stage 1: one slot, (2+1)·32 + 2·352 + head 76 + 312 = 1188.
  CHECK(s1.slots == 1);
  CHECK(s1.activations.bytes == 4 * 1188 + kIdsLast + kScalars);
  // Receive buffer + M send buffers of N·C on both stages; nothing for ZeRO 0.
  CHECK(s0.comm_buffers.bytes == 4 * 5 * 32);
  CHECK(s1.comm_buffers.bytes == 4 * 5 * 32);
  CHECK(s0.total_bytes == 4 * (1568 + 1568 + 2 * 1568) + kAdamwArgs + 2 * (4 * 1496 + kIdsFirst) +
                              kScalars + 4 * 160);
  // Each stage builds only its groups of the model (80 + 5·496 + 8 = 2568 in all): the start-up
  // peaks at the state each stage keeps (16 B per element held + the scalars).
  CHECK(p.model_params == 2568);
  CHECK(s0.startup_params_bytes == 4 * 1568);
  CHECK(s1.startup_params_bytes == 4 * 1080);
  CHECK(s0.startup_bytes == 16 * 1568 + kAdamwArgs + kScalars);
  CHECK(s1.startup_bytes == 16 * 1080 + kAdamwArgs + kScalars);
  // M × 4·N·C = 4 × 128 B one way, the tied-embedding gradient all-reduce 4·80 B, and the loss
  // and gradient norm (8 B each, a ring of 2 sends each once).
  CHECK(s0.sent_pipeline.bytes == 4 * 128 + 320 + 16);
  CHECK(s1.sent_pipeline.bytes == 4 * 128 + 320 + 16);

  // Activation checkpointing: each slot keeps the layer inputs and one recomputed layer.
  r.training.activation_checkpointing = true;
  CHECK(plan_memory(r, 2).ranks[0].activations.bytes ==
        2 * (4 * (4 * 32 + 352 + 312) + kIdsFirst) + kScalars);
  r.training.activation_checkpointing = false;

  r.model.n_layers = 4;  // even: 2 + 2
  r.model.tie_embeddings = false;
  const MemoryPlan q = plan_memory(r, 2);
  CHECK(q.ranks[0].num_layers == 2);
  CHECK(q.ranks[1].first_layer == 2);
  CHECK(q.ranks[1].param_elems == 2 * 496 + 88);  // norm and lm_head
  CHECK(q.ranks[0].sent_pipeline.bytes == 4 * 128 + 16);
}

TEST_CASE("plan: fewer micro-batches than stages: slots = min(P − p, M)") {
  Recipe r = small();
  r.model.n_layers = 3;
  r.parallel.pipeline = 3;
  r.training.global_batch_size = 2;  // M = 2
  const MemoryPlan p = plan_memory(r, 3);
  CHECK(p.accum == 2);
  CHECK(p.ranks[0].slots == 2);
  CHECK(p.ranks[1].slots == 2);
  CHECK(p.ranks[2].slots == 1);
  // The middle stage: 2 × ((1+1)·32 + 352 + 312); receive + 2 send buffers.
  CHECK(p.ranks[1].activations.bytes == 4 * 2 * (64 + 352 + 312) + kScalars);
  CHECK(p.ranks[1].comm_buffers.bytes == 4 * 3 * 32);
  CHECK(p.ranks[1].param_elems == 496);
  // Activations forward and gradients backward, 2 × 128 B each; 2 · R_3(8 B) = 2 · 10 B.
  CHECK(p.ranks[1].sent_pipeline.bytes == 2 * 2 * 128 + 2 * (2 * 2 * 8 / 3));
}

TEST_CASE("plan: ZeRO over 2 data ranks × 2 pipeline stages, tied embeddings") {
  // V = 100: n_embed = 800 (shard 400), a layer 496 (248), the head the final norm 8 (4).
  // Stage 0: embedding + layer 0; stage 1: embedding + layer 1 + final norm. M = 1.
  auto plan = [](int z) {
    Recipe r = small(z, /*tied=*/true);
    r.model.vocab_size = 100;
    r.parallel.pipeline = 2;
    r.training.global_batch_size = 2;
    MemoryPlan p = plan_memory(r, 4);
    REQUIRE(p.data == 2);
    REQUIRE(p.accum == 1);
    REQUIRE(p.ranks[1].stage == 1);
    return p;
  };
  const MemoryPlan z2 = plan(2), z3 = plan(3);
  const RankPlan &a2 = z2.ranks[0], &b2 = z2.ranks[1], &a3 = z3.ranks[0], &b3 = z3.ranks[1];
  CHECK(a2.grads.bytes == 4 * (400 + 248));
  CHECK(b2.grads.bytes == 4 * (400 + 248 + 4));
  CHECK(b2.params.bytes == 4 * (800 + 496 + 8));
  CHECK(b3.params.bytes == 4 * (400 + 248 + 4));
  CHECK(b3.optim.bytes == 8 * (400 + 248 + 4) + kAdamwArgs);
  // ZeRO-2, stage 0: all-gather buffer 2·400 + the embedding's working gradient and result
  // 800 + 400 (no embedding gradient held open: the head is on the other stage); pipeline
  // buffers (M+1)·N·C = 64.
  CHECK(a2.comm_buffers.bytes == 4 * (800 + 1200 + 64));
  // Stage 1: the head's backward holds its working gradient 8 + result 4 + the embedding's
  // working gradient 800 (opened by the tied lm_head in the head's forward) = 812 < the
  // embedding's own 800 + 400.
  CHECK(b2.comm_buffers.bytes == 4 * (800 + 1200 + 64));
  // ZeRO-3, stage 0: the embedding's backward 800 + 400 beats a gathered layer and its working
  // gradient 2·496.
  CHECK(a3.comm_buffers.bytes == 4 * (1200 + 64));
  // Stage 1: the head's forward, which runs its backward chunk by chunk, gathers the head 8 and
  // the embedding 800 and opens the embedding's working gradient 800: 8 + 2·800.
  CHECK(b3.comm_buffers.bytes == 4 * (1608 + 64));
  // Sent over the data group (ZeRO-3): reduce-scatter Σs, and all-gathers, the embedding once on
  // each stage (on stage 1 for the head's forward, which takes its weight gradient too), layers
  // and head twice.
  CHECK(a3.sent_data.bytes == 4 * (400 + 248) + 4 * (400 + 2 * 248) + kDataScalarsZ2);
  CHECK(b3.sent_data.bytes == 4 * (400 + 248 + 4) + 4 * (400 + 2 * 248 + 2 * 4) + kDataScalarsZ2);
  // The tied embedding's gradient shard (400) all-reduced between the stages.
  CHECK(a3.sent_pipeline.bytes == 128 + 4 * 400 + 16);
  CHECK(b3.sent_pipeline.bytes == 128 + 4 * 400 + 16);
  CHECK(z3.model_params == 800 + 2 * 496 + 8);
  // Only this stage's groups are built (1304 of the model's 1800): sharding them (the full 1304
  // and both shard sets, 2·652) and the state kept (16·652) tie, with the scalars. Parameter
  // memory peaks while ZeRO-3 takes them over: the full 1304 and their shard, 652.
  CHECK(b3.startup_params_bytes == 4 * (1304 + 652));
  CHECK(b3.startup_bytes == 4 * (1304 + 2 * 652) + kAdamwArgs + kScalars);
}

TEST_CASE("plan: rank layout rank = (d·P + p)·T + t") {
  Recipe r = small();
  r.model.n_kv_heads = 2;
  r.model.n_layers = 4;
  r.parallel.tensor = 2;
  r.parallel.pipeline = 2;
  r.training.global_batch_size = 2;
  const MemoryPlan p = plan_memory(r, 8);
  CHECK(p.data == 2);
  for (const RankPlan& k : p.ranks)
    CHECK(k.rank == (k.data_rank * 2 + k.stage) * 2 + k.tensor_rank);
  CHECK(p.ranks[5].tensor_rank == 1);
  CHECK(p.ranks[5].stage == 0);
  CHECK(p.ranks[5].data_rank == 1);
  // Tensor statistics on every stage: A_tp = N·C + 5·N = 52 per slot (one slot, M = 1).
  // Stage 0: 3·32 residual + 2·244 layers + 52 + 204 backward scratch; stage 1: + A_head 56.
  CHECK(p.ranks[0].activations.bytes == 4 * (96 + 488 + 52 + 204) + kIdsFirst + kScalars);
  CHECK(p.ranks[2].activations.bytes == 4 * (96 + 488 + 56 + 52 + 204) + kIdsLast + kScalars);
  const auto roles = ft::plan_roles(p);
  REQUIRE(roles.size() == 2);  // one per pipeline stage
  CHECK(roles[0] == std::vector<int>{0, 1, 4, 5});
  CHECK(ft::format_rank_list(roles[1]) == "2-3, 6-7");
}

TEST_CASE("plan: rank lists") {
  CHECK(ft::format_rank_list({0}) == "0");
  CHECK(ft::format_rank_list({0, 1, 2, 3}) == "0-3");
  CHECK(ft::format_rank_list({0, 2, 3, 7}) == "0, 2-3, 7");
}

TEST_CASE("plan: a world or a model that does not fit the layout is an error") {
  Recipe r = small();
  r.parallel.tensor = 2;
  r.model.n_kv_heads = 2;
  CHECK_THROWS_AS(plan_memory(r, 3), ft::Error);
  r.model.vocab_size = 11;  // the vocabulary is not padded
  CHECK_THROWS_AS(plan_memory(r, 2), ft::Error);
}

TEST_CASE("plan: the CUDA device adds the cuBLASLt workspace and the ops' scratch") {
  const ft::PlanDevice h100{.cuda = true, .sm = 90, .why = "test"};
  const ft::PlanDevice a100{.cuda = true, .sm = 80, .why = "test"};
  Recipe r = small(0);
  const RankPlan cpu = plan_memory(r, 1).ranks[0];
  const RankPlan gpu = plan_memory(r, 1, h100).ranks[0];
  CHECK(cpu.backend.bytes == 0);
  // Scratch asks in step order: attention on tensor cores' forward (head-major q, k, v, out,
  // 128/64/64/128 B, each a 256-byte piece, and S: 1 slab × 4 positions × G 2 × ld 16 fp32 =
  // 512 B: 1536 B), cross-entropy 8·N = 32 B, RMSNorm's backward partials 4·min(N, 512)·C =
  // 128 B, attention's backward (q, k, v, dO, dQ, dK, dV pieces 1792 B, S and dP 1024 B: 2816 B
  // > 1536: grows to max(2816, 2·1536) = 3072), sum_squares (496 elements: one block, 8 B).
  CHECK(gpu.backend.bytes == (int64_t{32} << 20) + 3072);
  CHECK(plan_memory(r, 1, a100).ranks[0].backend.bytes == (int64_t{4} << 20) + 3072);
  CHECK(gpu.total_bytes == cpu.total_bytes + gpu.backend.bytes);  // fp32: nothing else differs
  // bf16: the CUDA attention backward sums dQ in registers: no N·HD fp32 buffer (32 elements).
  r.training.precision = "bf16";
  const RankPlan cpu16 = plan_memory(r, 1).ranks[0];
  const RankPlan gpu16 = plan_memory(r, 1, h100).ranks[0];
  CHECK(cpu16.activations.bytes - gpu16.activations.bytes == 4 * 32);
}

TEST_CASE("plan: host memory: a checkpoint's staging or copy, model.from's read buffer") {
  using ft::MemoryCategory;
  auto cat = [](const RankPlan::ByCategory& by, MemoryCategory c) { return by[size_t(c)]; };
  // Nothing on the host without checkpoints or model.from: the CPU device's host need is the
  // device's own peak.
  {
    const RankPlan k = plan_memory(small(0), 1).ranks[0];
    CHECK(k.host_pinned.bytes == 0);
    CHECK(k.host_pageable.bytes == 0);
    CHECK(k.host_peak_bytes == 0);
    CHECK(k.host_need_bytes == k.peak_bytes);
    CHECK(k.host_pinned.how == "none");
  }
  // checkpoint.async: the staging buffer, 12 B (weights, m, v in fp32) per element of the rank's
  // ZeRO cut (even at stage 0), page-locked, held from before the first step. One rank: 1160
  // elements; 2 data ranks: 580 each. On the CPU it comes on top of the step's device peak.
  for (int world : {1, 2}) {
    Recipe r = small(world == 1 ? 0 : 1);
    r.training.global_batch_size = world;
    r.checkpoint.every_steps = 10;
    r.checkpoint.async = true;
    const RankPlan k = plan_memory(r, world).ranks[size_t(world - 1)];
    const int64_t staging = 12 * 1160 / world;
    CHECK(k.host_pinned.bytes == staging);
    CHECK(cat(k.host_pinned_by, MemoryCategory::kCheckpoint) == staging);
    CHECK(k.host_pageable.bytes == 0);
    CHECK(k.host_peak_bytes == staging);
    CHECK(k.host_need_bytes == std::max(k.startup_bytes, k.total_bytes + staging));
    // The CUDA device's host need is the host memory alone.
    const RankPlan g = plan_memory(r, world, {.cuda = true, .sm = 90, .why = "test"}).ranks[0];
    CHECK(g.host_pinned.bytes == staging);
    CHECK(g.host_need_bytes == staging);
  }
  // A synchronous save copies each piece on the device to the host, through one pageable buffer
  // of the largest: a layer group (496 elements; 248 on each of 2 data ranks).
  for (int world : {1, 2}) {
    Recipe r = small(0);
    r.training.global_batch_size = world;
    r.checkpoint.every_steps = 10;
    const RankPlan k = plan_memory(r, world).ranks[0];
    CHECK(k.host_pinned.bytes == 0);
    CHECK(k.host_pageable.bytes == 4 * 496 / world);
    CHECK(cat(k.host_pageable_by, MemoryCategory::kCheckpoint) == 4 * 496 / world);
  }
  // model.from: the weights are read a group at a time into one fp32 buffer of the largest group
  // the rank holds (a layer, 496 elements), and nothing of the folder is read (it need not
  // exist: the recipe's sizes came from its config.json).
  {
    Recipe r = small(0);
    r.model.from = "/nonexistent/config-only-folder";
    const RankPlan k = plan_memory(r, 1).ranks[0];
    CHECK(k.host_pageable.bytes == 4 * 496);
    CHECK(cat(k.host_pageable_by, MemoryCategory::kParameters) == 4 * 496);
    CHECK(k.host_pinned.bytes == 0);
    // The device's figures are the read's uploads, as a run that loads the folder counts them.
    const RankPlan seeded = plan_memory(small(0), 1).ranks[0];
    CHECK(k.total_bytes == seeded.total_bytes);
    // Tensor 2 (2 kv heads, so that they split): a layer's slice is its norms 2·8 and half of
    // q, k, v, o (8·8 each) and gate, up, down (12·8 each): 16 + 544 / 2 = 288 elements, more
    // than the embedding's 40 or the head's 8 + 40.
    r.parallel.tensor = 2;
    r.model.n_kv_heads = 2;
    const RankPlan t = plan_memory(r, 2).ranks[0];
    CHECK(t.host_pageable.bytes == 4 * (16 + (64 + 64 + 64 + 64 + 3 * 96) / 2));
  }
}

TEST_CASE("plan: a node's host memory is its ranks' host needs summed") {
  Recipe r = small(1);
  r.training.global_batch_size = 4;
  r.checkpoint.every_steps = 10;
  r.checkpoint.async = true;
  const ft::PlanDevice gpu{.cuda = true, .sm = 90, .why = "test"};
  MemoryPlan p = plan_memory(r, 4, gpu);
  ft::plan_host(p, 3);  // nodes of 3: ranks 0-2 and 3
  REQUIRE(p.node_host_bytes.size() == 2);
  const int64_t each = p.ranks[0].host_need_bytes;
  CHECK(each == 12 * 290);  // 1160 elements over 4 data ranks, 12 B each
  CHECK(p.node_host_bytes[0] == 3 * each);
  CHECK(p.node_host_bytes[1] == each);
  CHECK(p.ranks[2].host_node_bytes == 3 * each);
  CHECK(p.ranks[3].host_node_bytes == each);
}
