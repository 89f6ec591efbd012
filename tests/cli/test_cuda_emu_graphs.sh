#!/usr/bin/env bash
# FT_CUDA_GRAPHS=1 on the CUDA backend, executed without a GPU (ft_emu: the backend on the CUDA
# emulation, a test tool; nothing here says anything about GPU speed). A training micro-batch's
# forward and backward are recorded as a graph at the second micro-batch of a shape and replayed
# after (LlamaModel::train_micro_batch), and so is the optimizer step's AdamW (AdamW::step: its
# constants, the learning rate, the step count and the clipping factor, read from device memory);
# replaying the recorded work gives the bits of launching it op by op. Each configuration trains
# twice, FT_CUDA_GRAPHS=0 and 1, and must give the same losses, grad norms, eval losses and
# checkpoint bytes, with the number of recordings it should (micro-batch, optimizer step):
#  - fp32 with accumulation, evaluation, clipping and checkpoints: one recording for the run (the
#    token weight changes every step and is read from device memory; seen: a graph launch
#    dropped every other time makes the checkpoints differ);
#  - bf16 with activation checkpointing; fp16 (loss scaling: the scale is in the token weight);
#  - LoRA (r 4), and with dropout 0.1: its keys change every micro-batch and the dropout op reads
#    them from device memory, staged with the micro-batch's inputs (seen: with the keys passed by
#    value, as before, the replays reuse the recording's masks and the bytes differ);
#  - QLoRA in bf16 with activation checkpointing: the host skips a dequantization when the shared
#    buffer already holds the group, so the recording starts from an unknown state and each launch
#    leaves the host believing what the recording left (seen: recorded from the host's cached
#    state instead, the first replay after an evaluation used another layer's weights);
#  - packed documents in bf16 at head dim 64 (the fused attention with segment ids) through the
#    Hopper kernels (FT_CUDA_ATTENTION_SM90=1: their TMA descriptors are kernel arguments);
#  - ZeRO stage 3 (its hooks gather and reduce around the layers, and prefetch): the micro-batch
#    recorded once a step has recorded the acquisition order, so that the graph prefetches
#    (planted: recorded in the first step, before the order, the launches are 15, not 13), its
#    gathers and working gradients in buffers kept for the run, and over two data ranks with
#    activation checkpointing, and with LoRA in bf16 with a bf16 reduce_dtype and no prefetch;
#    ZeRO stage 2 on one rank with tied embeddings (the shared matrix's working gradient taken
#    at the head, reported at the embedding): the micro-batch recorded with its
#    working gradients' sums into the shards (buffers kept for the run); and over two data ranks
#    (`--nproc 2`, the emulated NCCL) with its reduce-scatters (planted: kept buffers not reused fail
#    the recording, an allocation; so do the scatters not retired inside the graph, the capture
#    left unjoined); each rank records its own shard's update;
#  - two data ranks at ZeRO stage 0 with two micro-batches a step: the first of each step is
#    recorded and replayed (the hooks only count it on the host: GroupHooks::Replay::kHostOnly),
#    and so is the second, whose gradients overlap_comm all-reduces during its backward, in a
#    graph of its own with the emulated NCCL's bf16 all-reduces inside (kCollectives, with
#    reduce_dtype bf16: the conversions each way recorded too); at ZeRO 1 in
#    bf16 without overlap_comm one graph serves both; at ZeRO 1 with LoRA and one micro-batch a
#    step each is a step's last (each rank's recordings and launches counted from the run's
#    closing count). Planted: the launches not making the hooks' grads_ready calls keeps the bits (the
#    reductions then run after the backward) but ZeroSharding's warning of an unreported
#    gradient fires, which fails `pair`; the calls made while recording as well as after the
#    launch counts the recorded micro-batch twice, reduces its partial gradient early, and the
#    grad norms differ; so do the all-reduces not made at a launch; the reducing micro-batch's
#    host part skipped after a launch makes the warning fire; its recording not joined fails
#    (cudaErrorStreamCaptureUnjoined) and the counts go wrong;
#  - pipeline stages: each half of a training micro-batch recorded per activation slot (three
#    stages, QLoRA in bf16 with activation checkpointing; two stages of two tensor ranks with
#    tied embeddings), the transfers outside; planted: one graph for every slot records too few;
#    the middle stage's input gradient read from the last forward's slot after a launch changes
#    the bits;
#  - two tensor ranks: their all-reduces (every layer's, the loss's) recorded into the graph; and
#    tensor 2 × data 2 at ZeRO 2 (four ranks: both groups' collectives in one graph);
#  - FT_CUDA_GRAPHS set on one rank only is refused at the start (exit 2);
#  - the overlapped update over two data ranks: the micro-batches with no update pending recorded,
#    the others op by op (a warning says so);
#  - a run that cannot record (pipeline stages with data ranks, ZeRO 2 over MPI) warns once a
#    rank with the reason, and the runs above that record warn nothing of the kind (planted: the
#    warning not kept to once warns at every micro-batch);
#  - recordings that fail (FT_CUDA_EMU_GRAPH_INSTANTIATE=fail: the emulation refuses every
#    instantiation) are cancelled with a warning each, and QLoRA's run at ZeRO 2 goes on op by
#    op with the same bits (the counts restored, the kept buffers freed); so does a two-rank run
#    whose recording with its all-reduces fails on one rank only
#    (FT_CUDA_EMU_GRAPH_INSTANTIATE=fail@1): the ranks agree, both undo the recorded calls
#    and go on op by op (planted: the counts not restored is an internal error); so does one
#    that fails midway, at ZeRO 3 (FT_CUDA_EMU_GRAPH_CAPTURE=fail@60).
#   bash tests/cli/test_cuda_emu_graphs.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
need_emu
mpi_env
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:2" "$tmp/valid:1" --vocab 97 \
  --samples 40 --seq-len 16 --seed 5

cat > "$tmp/r.yaml" <<YAML
run: {name: g, output_dir: $tmp/out, seed: 3}
model: {dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 80, vocab_size: 97, max_seq_len: 16}
data: {train: $tmp/train, valid: $tmp/valid, seq_len: 16, shuffle: true}
training: {steps: 8, micro_batch_size: 2, global_batch_size: 4, eval_every_steps: 4, eval_batches: 2,
           grad_clip: 0.5}
optimizer: {lr: 0.003}
checkpoint: {every_steps: 4}
logging: {every_steps: 1}
runtime: {threads: 2, device: cuda}
YAML

# pair NAME MICRO OPTIM [OVERRIDES...]: both runs, then the same bits, MICRO recordings of a
# micro-batch and OPTIM of the optimizer step.
pair() {
  local name=$1 want=$2 want_optim=$3
  shift 3
  for g in 0 1; do
    FT_CUDA_GRAPHS=$g "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/$name.$g" "$@" \
      > "$tmp/$name.$g.log" 2>&1 || fail "$name (FT_CUDA_GRAPHS=$g): $(tail -3 "$tmp/$name.$g.log")"
  done
  local got
  got=$(grep -c 'micro-batch .* recorded as a graph' "$tmp/$name.1.log" || true)
  [ "$got" = "$want" ] || fail "$name: $got recordings, expected $want: $(grep -m2 FT_CUDA_GRAPHS "$tmp/$name.1.log")"
  got=$(grep -c 'optimizer step recorded as a graph' "$tmp/$name.1.log" || true)
  [ "$got" = "$want_optim" ] || fail "$name: $got optimizer recordings, expected $want_optim"
  ! grep -q 'recorded as a graph' "$tmp/$name.0.log" || fail "$name: recorded with FT_CUDA_GRAPHS=0"
  ! grep -q 'reduced after the backward instead of during it' "$tmp/$name.1.log" \
    || fail "$name: $(grep -m1 'reduced after the backward' "$tmp/$name.1.log")"
  [[ -n ${PAIR_WARNS:-} ]] || ! grep -q 'FT_CUDA_GRAPHS=1: .* of this run is recorded: ' "$tmp/$name.1.log" \
    || fail "$name: $(grep -m1 'FT_CUDA_GRAPHS=1: ' "$tmp/$name.1.log")"
  echo "$name ($want + $want_optim recording(s)):"
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$tmp/$name.0" "$tmp/$name.1" \
    --min-entries 16 --loss-rel 0 --norm-rel 0 --step1-loss-rel 0 --step1-norm-rel 0 \
    || fail "$name: graphs changed the metrics"
  local n=0 f
  for f in "$tmp/$name.0"/checkpoints/step_*/rank_*.bin; do
    cmp -s "$f" "$tmp/$name.1/checkpoints/${f#"$tmp/$name.0"/checkpoints/}" \
      || fail "$name: graphs changed checkpoint bytes: $f"
    n=$((n + 1))
  done
  [ "$n" -ge 2 ] || fail "$name: only $n checkpoint files compared"
}

pair f32 1 1
pair bf16_ac 1 1 training.precision=bf16 training.activation_checkpointing=true
pair fp16 1 1 training.precision=fp16
pair lora 1 1 adapter.type=lora adapter.r=4
pair lora_dropout 1 1 adapter.type=lora adapter.r=4 adapter.dropout=0.1
pair qlora_bf16_ac 1 1 adapter.type=qlora adapter.r=4 training.precision=bf16 \
  training.activation_checkpointing=true
FT_CUDA_EMU_LAUNCHES=1 FT_CUDA_ATTENTION_SM90=1 pair packed_sm90 1 1 data.pack=true \
  training.precision=bf16 model.dim=128 model.n_heads=2 model.n_kv_heads=1
for kernel in forward dkdv dq; do
  grep -q "ft_emu launches: (attention_sm90_${kernel}_kernel" "$tmp/packed_sm90.1.log" \
    || fail "packed_sm90: no attention_sm90_${kernel}_kernel launch"
done
pair zero3 1 1 parallel.zero_stage=3
pair zero2_tied 1 1 parallel.zero_stage=2 model.tie_embeddings=true
# ranks2 NAME RECORDINGS LAUNCHES [RANKS]: on each of the two ranks (or RANKS; rank 0's lines have
# no prefix), RECORDINGS recordings of a micro-batch and LAUNCHES launches over the run.
ranks2() {
  local name=$1 recordings=$2 launches=$3 r lines
  for ((r = 0; r < ${4:-2}; r++)); do
    if [ "$r" = 0 ]; then
      lines=$(grep -v '^\[rank ' "$tmp/$name.1.log" || true)
    else
      lines=$(grep "^\[rank $r " "$tmp/$name.1.log" || true)
    fi
    [ "$(grep -c 'micro-batch .* recorded as a graph' <<< "$lines")" = "$recordings" ] \
      || fail "$name: rank $r did not record a micro-batch $recordings time(s)"
    grep -q "FT_CUDA_GRAPHS: $launches training micro-batches launched from $recordings recording" \
      <<< "$lines" || fail "$name: rank $r: $(grep 'micro-batches launched' <<< "$lines")," \
      "expected $launches launches"
  done
}
# Eight steps of two micro-batches: with overlap_comm each rank records the first and the second
# of step 2 (the second with its all-reduces) and launches both in steps 2-8 (14); without it the
# one graph serves every micro-batch from step 1's second (15). One micro-batch a step: each is
# a step's last, recorded with its all-reduces at step 2 and launched in steps 2-8 (7), here
# with LoRA (the frozen base groups report nothing) in fp16, with a NaN in rank 1's gradient at
# step 3 (FT_TEST_NAN_GRAD_AT_STEP=3:1: the step skipped on both ranks, rank 1's micro-batch
# still launched: the kind of micro-batch is the same on every rank). Buckets of 1 KiB: a
# group's all-reduce in several calls, here in bf16 (reduce_dtype: each call converts into its
# kept 16-bit buffer of its own, and the graph widens the sums back after the calls).
pair zero0_ranks2_accum 4 2 training.global_batch_size=8 parallel.reduce_bucket_mb=0.0009765625 \
  parallel.reduce_dtype=bf16 --nproc 2
ranks2 zero0_ranks2_accum 2 14
[ "$(grep -c 'micro-batch .* with its all-reduces recorded as a graph' "$tmp/zero0_ranks2_accum.1.log")" = 2 ] \
  || fail "zero0_ranks2_accum: the reducing micro-batch was not recorded with its all-reduces on both ranks"
pair zero1_ranks2_no_overlap_bf16 2 2 training.global_batch_size=8 parallel.zero_stage=1 \
  parallel.overlap_comm=false training.precision=bf16 --nproc 2
ranks2 zero1_ranks2_no_overlap_bf16 1 15
FT_TEST_NAN_GRAD_AT_STEP=3:1 pair zero1_ranks2 2 2 parallel.zero_stage=1 adapter.type=lora \
  adapter.r=4 training.precision=fp16 --nproc 2
ranks2 zero1_ranks2 1 7
grep -q '^warning: step 3: gradient overflow at loss scale .*step skipped' "$tmp/zero1_ranks2.1.log" \
  || fail "zero1_ranks2: step 3 was not skipped for rank 1's NaN"
# The overlapped update (AdamW on the update stream, under the next forward; not recorded) over
# two data ranks, two micro-batches a step, reduce_dtype bf16: a step's first micro-batch waits
# for the update op by op (one warning a rank says so), its second, which all-reduces, is
# recorded at step 2 and launched in steps 2-8 (7); step 5's first, after step 4's evaluation
# and checkpoint waited for the update, is a step's first with nothing pending: recorded
# (kHostOnly, warmed in step 1) and launched once. 2 recordings and 8 launches a rank.
PAIR_WARNS=1 pair overlap_update_ranks2 4 0 parallel.overlap_update=true \
  training.global_batch_size=8 parallel.reduce_dtype=bf16 --nproc 2
ranks2 overlap_update_ranks2 2 8
[ "$(grep -c "warning: FT_CUDA_GRAPHS=1: not every .*: with parallel.overlap_update the micro-batch after each update" \
  "$tmp/overlap_update_ranks2.1.log")" = 2 ] || fail "overlap_update_ranks2: not one warning a rank"
# ZeRO 2 over two data ranks: every micro-batch reduce-scatters each group's working gradient, in
# buffers kept for the run, and is recorded with its calls (here bf16 conversions each way, two
# micro-batches a step, fp16 with a NaN in rank 1's gradient at step 3, which goes into its
# gradient shard before the launch): one graph a rank from step 1's second (15 launches).
FT_TEST_NAN_GRAD_AT_STEP=3:1 pair zero2_ranks2 2 2 parallel.zero_stage=2 \
  training.global_batch_size=8 parallel.reduce_dtype=bf16 training.precision=fp16 --nproc 2
ranks2 zero2_ranks2 1 15
grep -q '^warning: step 3: gradient overflow at loss scale .*step skipped' "$tmp/zero2_ranks2.1.log" \
  || fail "zero2_ranks2: step 3 was not skipped for rank 1's NaN"
# ZeRO 3 over two data ranks with activation checkpointing (each layer gathered three times a
# micro-batch, the next one prefetched): step 1 records the order op by op, step 2's first is the
# warm-up, its second is recorded with its all-gathers and reduce-scatters (13 launches).
pair zero3_ranks2 2 2 parallel.zero_stage=3 training.global_batch_size=8 \
  training.activation_checkpointing=true --nproc 2
ranks2 zero3_ranks2 1 13
# ZeRO 3 with LoRA (the frozen base gathered, only the adapters reduce-scattered), bf16 with a
# bf16 reduce_dtype and no prefetch (each gather at its acquire: recorded from step 1's second
# micro-batch, as no order is needed; 15 launches).
pair zero3_ranks2_lora_bf16 2 2 parallel.zero_stage=3 adapter.type=lora adapter.r=4 \
  training.global_batch_size=8 parallel.reduce_dtype=bf16 training.precision=bf16 \
  parallel.prefetch_blocks=0 --nproc 2
ranks2 zero3_ranks2_lora_bf16 1 15
# Two tensor ranks (their all-reduces in every layer recorded into the graph), two micro-batches a
# step: one graph a rank from step 1's second micro-batch (15 launches).
pair tp2 2 2 parallel.tensor=2 model.vocab_size=98 --nproc 2
ranks2 tp2 1 15
# Tensor 2 × data 2 at ZeRO 2 (four ranks): the tensor all-reduces and the data group's
# reduce-scatters in one graph a rank, agreed on over both groups; 15 launches on every rank.
pair tp2_dp2_zero2 4 4 parallel.tensor=2 model.vocab_size=98 parallel.zero_stage=2 \
  training.global_batch_size=8 --nproc 4
ranks2 tp2_dp2_zero2 1 15 4
# What is not recorded says so, once a run and rank, with the reason: a lasting one (pipeline
# stages with ZeRO's hooks, here two data ranks; reduce-scatters over MPI), not ZeRO 3's first
# step (zero3 above: no such warning).
# refusal NAME RANKS REASON [OVERRIDES...]: one warning a rank, with REASON.
refusal() {
  local name=$1 ranks=$2 want=$3
  shift 3
  FT_CUDA_GRAPHS=1 "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/$name" training.steps=2 \
    training.eval_every_steps=0 checkpoint.every_steps=0 "$@" > "$tmp/$name.log" 2>&1 \
    || fail "$name: $(tail -3 "$tmp/$name.log")"
  [ "$(grep -c "warning: FT_CUDA_GRAPHS=1: .* of this run is recorded: " "$tmp/$name.log")" = "$ranks" ] \
    && [ "$(grep -c "warning: FT_CUDA_GRAPHS=1: .* of this run is recorded: $want" "$tmp/$name.log")" = "$ranks" ] \
    || fail "$name: expected one warning a rank, '$want': $(grep FT_CUDA_GRAPHS "$tmp/$name.log")"
}
refusal pipe2_dp2 4 "a pipeline stage's halves are not recorded with ZeRO's hooks yet" \
  parallel.pipeline=2 training.global_batch_size=8 --nproc 4
refusal zero2_mpi 2 "ZeRO stage 2's reduce-scatters over MPI are not recorded" \
  parallel.zero_stage=2 runtime.communicator=mpi --nproc 2
# Pipeline stages: each half of a training micro-batch recorded per activation slot, the
# transfers between stages outside the graphs; the op-by-op bits.
# pipe_launches NAME LAUNCHES...: rank r launched the r-th count of halves.
pipe_launches() {
  local name=$1 r want lines
  shift
  local counts=("$@")
  for ((r = 0; r < ${#counts[@]}; r++)); do
    want=${counts[$r]}
    if [ "$r" = 0 ]; then
      lines=$(grep -v '^\[rank ' "$tmp/$name.1.log" || true)
    else
      lines=$(grep "^\[rank $r " "$tmp/$name.1.log" || true)
    fi
    grep -q "FT_CUDA_GRAPHS: $want halves of training micro-batches (this pipeline stage's) launched" \
      <<< "$lines" || fail "$name: rank $r: $(grep 'launched from' <<< "$lines"), expected $want"
  done
}
# Three stages, three micro-batches a step (QLoRA in bf16 with activation checkpointing: a half's
# dequantized group left for the next). Stage 0 keeps three in flight (three slots: six graphs,
# recorded in step 2, 42 launches), stage 1 two (slot 0 twice a step: recorded at step 1's third
# micro-batch; slot 1 at step 2: 44), stage 2 one (recorded at step 1's second: 46). The middle
# stage sends the input gradient of the slot it launched (seen: after a launch input_grad() read
# the slot of the last forward, and the bits differed from step 2 on).
pair pipe3_qlora_ac 12 3 parallel.pipeline=3 model.n_layers=3 training.global_batch_size=6 \
  adapter.type=qlora adapter.r=4 training.precision=bf16 training.activation_checkpointing=true \
  --nproc 3
pipe_launches pipe3_qlora_ac 42 44 46
# Tensor 2 × pipeline 2 with tied embeddings (four ranks; the shared matrix summed between the
# stages after the backward): stage 0 with two slots (28 launches), stage 1 one (30).
pair pipe2_tp2_tied 12 4 parallel.pipeline=2 parallel.tensor=2 model.vocab_size=98 \
  model.tie_embeddings=true --nproc 4
pipe_launches pipe2_tp2_tied 28 28 30 30
FT_CUDA_EMU_GRAPH_INSTANTIATE=fail pair refused 0 0 adapter.type=qlora adapter.r=4 \
  parallel.zero_stage=2
grep -q "FT_CUDA_GRAPHS: recording the micro-batch as a graph failed, so the run goes on without graphs: .*cudaGraphInstantiate" \
  "$tmp/refused.1.log" || fail "refused: no warning naming the failed instantiation: $(grep -m2 FT_CUDA_GRAPHS "$tmp/refused.1.log")"
grep -q "FT_CUDA_GRAPHS: recording the optimizer step as a graph failed, so it runs op by op: .*cudaGraphInstantiate" \
  "$tmp/refused.1.log" || fail "refused: no warning naming the optimizer step's failed instantiation"
# A recording of the micro-batch with its all-reduces that fails on rank 1 only: both ranks undo
# its calls and go on op by op (rank 0's graph dropped: the ranks agree), with the same bits;
# rank 1's optimizer step runs op by op, rank 0's from its graph. QLoRA with an evaluation
# every step: the buffer holds the evaluation's last layer when rank 0's unused recording ends
# (seen: its belief about the dequantized group kept, layer 0 ran with another's weights).
FT_CUDA_EMU_GRAPH_INSTANTIATE=fail@1 pair refused_rank1 0 1 parallel.zero_stage=1 \
  adapter.type=qlora adapter.r=4 training.eval_every_steps=1 --nproc 2
grep -q '^\[rank 1 .*recording the micro-batch as a graph failed, so the run goes on without graphs: .*cudaGraphInstantiate' \
  "$tmp/refused_rank1.1.log" || fail "refused_rank1: rank 1 does not say why its recording failed"
grep -q '^[^[].*recording the micro-batch as a graph failed on another rank' \
  "$tmp/refused_rank1.1.log" || fail "refused_rank1: rank 0 does not drop its graph for rank 1's failure"
# The same over two tensor ranks (their all-reduces in the graph; the tensor group agrees).
FT_CUDA_EMU_GRAPH_INSTANTIATE=fail@1 pair refused_tp_rank1 0 1 parallel.tensor=2 \
  model.vocab_size=98 --nproc 2
grep -q '^[^[].*recording the micro-batch as a graph failed on another rank' \
  "$tmp/refused_tp_rank1.1.log" || fail "refused_tp_rank1: rank 0 does not drop its graph"
# A recording that fails midway (FT_CUDA_EMU_GRAPH_CAPTURE=fail@60: the emulation refuses the 60th
# operation recorded, a kernel of the backward) at ZeRO 3 over two data ranks, with parameters
# gathered and working gradients taken from the kept buffers when it stops: both ranks give them
# back (recording_failed), free them (graphs_off) and go on op by op with the same bits.
# Planted: the held counts not reset (an acquire skips its gather, and the bits differ), a kept
# buffer not given back (an internal error).
FT_CUDA_EMU_GRAPH_CAPTURE=fail@60 pair refused_midway 0 2 parallel.zero_stage=3 \
  training.global_batch_size=8 --nproc 2
[ "$(grep -c 'recording the micro-batch as a graph failed, so the run goes on without graphs: CUDA kernel launch failed' "$tmp/refused_midway.1.log")" = 2 ] \
  || fail "refused_midway: the recording did not fail midway on both ranks: $(grep -m2 FT_CUDA_GRAPHS "$tmp/refused_midway.1.log")"
# FT_CUDA_GRAPHS on one rank only: refused at the start (exit 2), before a recording could be
# agreed on by some ranks only (which would hang).
rc=0
mpirun "${mpirun_args[@]}" -np 1 -x FT_CUDA_GRAPHS=1 "$emu" train "$tmp/r.yaml" \
  run.output_dir="$tmp/mixed" : -np 1 "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/mixed" \
  > "$tmp/mixed.log" 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "FT_CUDA_GRAPHS on rank 0 only: exit $rc, expected 2: $(tail -3 "$tmp/mixed.log")"
grep -q '^ft: error: FT_CUDA_GRAPHS is set differently on the ranks (rank 0: graphs on' \
  "$tmp/mixed.log" || fail "FT_CUDA_GRAPHS on rank 0 only: $(grep -m1 error "$tmp/mixed.log")"
echo "ok: graphs replay the bits of launching op by op"
