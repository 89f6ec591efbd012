#!/usr/bin/env bash
# training.loss_chunk_tokens (DESIGN.md §3 "The head in chunks"): the output projection, the
# cross-entropy and the head's backward run over chunks of a micro-batch's tokens. A tiny GQA
# Llama (vocabulary 64, one target in five masked) trains 2 steps of 2 micro-batches of 2 × 12
# tokens, cut in chunks of 5 (5, 5, 5, 5, 4), against the same run in one chunk (0), fp32:
#  - the CPU, untied and tied (the head is the embedding's table, whose gradient the embedding's
#    backward adds to), and ZeRO-3 in one process (the head's gradient is ZeRO's working buffer,
#    reduce-scattered after the micro-batch's backward, its weight gathered in the forward);
#  - tensor 2 × pipeline 2, tied, under mpirun (the vocabulary-parallel cross-entropy: each
#    chunk's row max, sum of exponentials and target logit all-reduced over the tensor group; the
#    last stage holds the head, the embedding's copy, whose gradient it takes in the head's
#    forward and sums with the first stage's) against the one-process run in one chunk;
#  - with a third argument `cuda` (tests/cli/test_cuda_emu_loss_chunks.sh), instead, the emulated
#    CUDA device (ft_emu: cuBLASLt's accumulating weight-gradient GEMM and the cross-entropy
#    kernels), fp32 and bf16 (the logits in bf16; the head's gradient fp32).
# Each run against its reference: both steps' losses and the evaluation's within 1e-6 relative
# (fp32 sums in another order; seen ≤ 1e-9), grad norms within 1e-6 (seen ≤ 2.5e-8), and every
# parameter after the 2 steps within 1e-6 absolute (seen ≤ 7.5e-9). AdamW's eps is 1 here, so
# that an update is about lr·g/(1 + |g|), a function of the gradient's value rather than of its
# sign alone: with the head's weight gradient of all chunks but the first left out, step 1's
# grad norm moved by 20% and a parameter by 2.2e-2. The parameters are each rank's slices
# (FT_TEST_DUMP_PARAMS), put back together. About 7 s on 2 cores (cuda: 5 s).
#   bash tests/cli/test_loss_chunks.sh BUILD_DIR SOURCE_DIR [cpu|cuda]
source "$2/tests/cli/common.sh" "$@"
device=${3:-cpu}
[[ $device == cpu ]] || need_emu
mpi_env -x FT_TEST_DUMP_PARAMS
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:1" "$tmp/valid:1" --vocab 64 \
  --samples 24 --seq-len 12 --seed 7 --mask 0.8 > /dev/null

cat > "$tmp/r.yaml" <<YAML
run: {name: chunks, output_dir: $tmp/out, seed: 4}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 12}
data: {train: $tmp/train, valid: $tmp/valid, seq_len: 12}
training: {steps: 2, micro_batch_size: 2, global_batch_size: 4, grad_clip: 0, eval_every_steps: 2,
           eval_batches: 1}
optimizer: {lr: 0.1, eps: 1, weight_decay: 0}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

train() {  # NAME RANKS BINARY [OVERRIDES...]
  local name=$1 ranks=$2 bin=$3
  shift 3
  local cmd=("$bin" train "$tmp/r.yaml" run.output_dir="$tmp/$name" "$@")
  ((ranks == 1)) || cmd=(mpirun "${mpirun_args[@]}" -np "$ranks" "${cmd[@]}")
  FT_TEST_DUMP_PARAMS="$tmp/$name/params" "${cmd[@]}" > "$tmp/$name.log" 2>&1 ||
    fail "$name: $(tail -3 "$tmp/$name.log")"
}
# params.py RUN_A RUN_B: the largest difference between two runs' final parameters.
cat > "$tmp/params.py" <<'PY'
import glob, json, struct, sys
import numpy as np

def whole_model(folder):
    """Every tensor of a run, its ranks' slices (tensor ranks, pipeline stages) put together."""
    slices = {}
    for path in sorted(glob.glob(folder + "/rank_*.safetensors")):
        raw = open(path, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        meta = header.pop("__metadata__")
        for name, t in header.items():
            b, e = t["data_offsets"]
            data = raw[8 + n + b : 8 + n + e]
            if t["dtype"] == "F32":
                x = np.frombuffer(data, np.float32)
            else:  # BF16: the high half of an fp32
                x = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
            x, split, t_rank = x.reshape(t["shape"]), meta["split:" + name], int(meta["tensor_rank"])
            held = slices.setdefault(name, {})
            # A tensor two stages hold (the tied embedding) must be the same on both.
            assert t_rank not in held or (held[t_rank][0] == x).all(), (name, "stages differ")
            held[t_rank] = (x, split)
    out = {}
    for name, by_rank in slices.items():
        parts = [by_rank[r][0] for r in sorted(by_rank)]
        split = by_rank[0][1]
        out[name] = parts[0] if split == "replicated" else np.concatenate(
            parts, axis=0 if split == "rows" else 1)
    return out

a, b = whole_model(sys.argv[1]), whole_model(sys.argv[2])
assert sorted(a) == sorted(b) and a, (sorted(a), sorted(b))
worst = max(float(np.abs(a[n] - b[n]).max()) for n in a)
assert worst <= 1e-6, f"a parameter differs by {worst:.3g}"
print(f"parameters within {worst:.2g}")
PY
# same NAME REFERENCE: NAME's metrics and final parameters are REFERENCE's within the bounds above.
same() {
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$tmp/$1" "$tmp/$2" --min-entries 5 \
    --loss-rel 1e-6 --norm-rel 1e-6 > "$tmp/$1.compare" ||
    fail "$1 against $2: $(cat "$tmp/$1.compare")"
  local params
  params=$(/usr/bin/python3 "$tmp/params.py" "$tmp/$1/params" "$tmp/$2/params") ||
    fail "$1 against $2: parameters differ"
  echo "$1 = $2:$(sed 's/^ *worst/ worst/' "$tmp/$1.compare"); $params"
}

if [[ $device == cuda ]]; then
  for p in fp32 bf16; do
    train emu_${p}_one 1 "$emu" runtime.device=cuda training.precision=$p training.loss_chunk_tokens=0
    train emu_${p}_cut 1 "$emu" runtime.device=cuda training.precision=$p training.loss_chunk_tokens=5
    same emu_${p}_cut emu_${p}_one
  done
  exit 0
fi
train one 1 "$ft" training.loss_chunk_tokens=0
train cut 1 "$ft" training.loss_chunk_tokens=5
same cut one
train cut_z3 1 "$ft" training.loss_chunk_tokens=5 parallel.zero_stage=3
same cut_z3 one
train tied_one 1 "$ft" training.loss_chunk_tokens=0 model.tie_embeddings=true
train tied_cut 1 "$ft" training.loss_chunk_tokens=5 model.tie_embeddings=true
same tied_cut tied_one
train tensor2_pipeline2_tied_cut 4 "$ft" training.loss_chunk_tokens=5 parallel.tensor=2 \
  parallel.pipeline=2 model.tie_embeddings=true
same tensor2_pipeline2_tied_cut tied_one
