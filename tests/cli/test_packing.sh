#!/usr/bin/env bash
# Packing (data.pack, DESIGN.md §6) end to end:
#  a. The packed run's step-1 loss and gradient norm equal those of the unpacked run of the same
#     documents (each alone in its window, the padding after it masked out of the loss), within
#     1e-5 relative on the CPU in fp32 (seen: the same loss bits, grad norms 1.5e-10 apart);
#     with attention crossing documents they differ by 8e-4. RoPE positions restart at each
#     document, but as RoPE scores depend only on relative positions, a missing restart shows
#     here only as rounding (seen 4.5e-11): tests/unit/test_data_pack.cpp checks the restart
#     itself on the rotation (the CPU kernel) and tests/cuda_emu/test_rope.cpp the CUDA one.
#  b. Isolation: changing the tokens of one document whose targets are masked out changes
#     nothing else of its window (same loss and gradient norm, to 1e-6).
#  c. A packed run killed after its step-2 checkpoint and resumed gives the unbroken run's bits;
#     tensor 2, pipeline 2 and data 2 (ZeRO-3) give the one-process losses within 1e-5.
#  d. ft plan accounts for the packed step's buffers (planned == measured, as test_plan.sh).
#  e. ft inspect --seq-len prints the packing efficiency the greedy rule gives (computed here).
#  f. A bad data.pack_overflow names the file, line and key.
#  g. With ft_emu (the emulated CUDA device, fused attention: bf16, head dim 64): (a) within
#     1e-4 (loss) and 1e-3 (gradient norm) relative: both runs round alike, token for token
#     (seen 2e-16 and 4e-11), far inside test_cuda_emu_train.sh's 16-bit step-1 bounds. Shapes
#     the fused kernel does not take (fp32; head dim 8) are refused by ft validate and by ft
#     train before any data is read, naming data.pack, the precision, the head dim and the
#     device; FT_CUDA_ATTENTION=gemm by ft train's check of the device it made.
#  The packing line of the start-up is printed once (rank 0) by the multi-rank runs of (c).
#   bash tests/cli/test_packing.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
mpi_env

T=16
G=4
# Documents of 3..T tokens (so that each fits the unpacked window with its padding), random
# tokens and loss masks; "packed" holds them as documents; "unpacked" holds the documents the
# first packed step trains on, each padded to T tokens with loss_mask 0 (and its first token's
# mask 0: it is the previous window's last target), so that window k of the plain loader is
# document k alone. "isolated" is "packed" with document 0 masked out, "mutated" that with
# document 0's tokens changed. Prints the number of documents of the first packed step and
# the packing efficiency at seq_len T.
read -r n_docs efficiency < <(/usr/bin/python3 - "$src" "$tmp" $T $G <<'PY'
import os, sys
import numpy as np
sys.path.insert(0, os.path.join(sys.argv[1], "tests/ref"))
import llama_ref as ref
tmp, T, G = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(11)
docs = [rng.integers(3, 96, rng.integers(3, T + 1)) for _ in range(60)]
masks = [(rng.random(d.size) < 0.8).astype(np.uint8) for d in docs]

def write(folder, docs, masks):
    os.makedirs(folder)
    offsets = list(np.cumsum([0] + [d.size for d in docs[:-1]]))
    ref.write_shard(os.path.join(folder, "s.h5"), np.concatenate(docs), 96,
                    doc_offsets=[int(o) for o in offsets], loss_mask=np.concatenate(masks))

write(f"{tmp}/packed", docs, masks)
# The greedy packing of loader.h: a window takes the next document while its pairs fit.
windows, used = [], T + 1
for i, d in enumerate(docs):
    if used + d.size - 1 > T:
        windows.append([])
        used = 0
    windows[-1].append(i)
    used += d.size - 1
first = [i for w in windows[:G] for i in w]
pad_docs, pad_masks = [], []
for i in first:
    pad = T - docs[i].size
    pad_docs.append(np.concatenate([docs[i], np.full(pad, 5)]))
    m = np.concatenate([masks[i], np.zeros(pad, np.uint8)])
    m[0] = 0
    pad_masks.append(m)
pad_docs.append(np.array([5]))
pad_masks.append(np.array([0], np.uint8))
write(f"{tmp}/unpacked", pad_docs, pad_masks)
iso = [m.copy() for m in masks]
iso[0][:] = 0
write(f"{tmp}/isolated", docs, iso)
mut = [d.copy() for d in docs]
mut[0] = (mut[0] * 7 + 11) % 93 + 3
write(f"{tmp}/mutated", mut, iso)
filled = sum(d.size - 1 for d in docs)
print(len(first), "%.2f%%" % (100.0 * filled / (len(windows) * T)))
PY
)
[[ -n $n_docs ]] || fail "could not write the shards"

cat > "$tmp/r.yaml" <<YAML
run: {name: pack, output_dir: $tmp/out, seed: 3}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 96, max_seq_len: $T}
data: {train: $tmp/packed, seq_len: $T, shuffle: false, pack: true}
training: {steps: 1, micro_batch_size: 1, global_batch_size: $G}
optimizer: {lr: 0.01}
checkpoint: {every_steps: 2}
logging: {every_steps: 1}
runtime: {threads: 2}
YAML

train() {  # BINARY NAME [OVERRIDES...]
  local bin=$1 name=$2
  shift 2
  "$bin" train "$tmp/r.yaml" run.output_dir="$tmp/$name" "$@" > "$tmp/$name.log" 2>&1 \
    || fail "$name: $(tail -3 "$tmp/$name.log")"
}
# close A B LOSS_REL NORM_REL: every step's loss and grad_norm of runs A and B within the bounds
# (0: the same bits); prints the worst differences.
close() {
  /usr/bin/python3 - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "$3" "$4" <<'PY' \
    || fail "$1 and $2 differ"
import json, sys
def steps(p):
    out = {}
    for l in map(json.loads, open(p)):
        if "loss" in l:
            out[l["step"]] = l
    return out
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert a and a.keys() == b.keys(), (sorted(a), sorted(b))
for key, bound in (("loss", float(sys.argv[3])), ("grad_norm", float(sys.argv[4]))):
    worst = max(abs(a[s][key] - b[s][key]) / abs(b[s][key]) for s in a)
    print(f"  {key}: worst relative difference {worst:.3g} (bound {bound:g})")
    for s in a:
        if abs(a[s][key] - b[s][key]) > bound * abs(b[s][key]):
            sys.exit(f"step {s} {key}: {a[s][key]!r} vs {b[s][key]!r}")
PY
}

# a. Packed against unpacked (one step: the same documents, the same token-weighted mean).
train "$ft" cpu_packed
train "$ft" cpu_unpacked data.train="$tmp/unpacked" data.pack=false \
  training.global_batch_size="$n_docs"
grep -q "samples of $T tokens per epoch" "$tmp/cpu_unpacked.log" || fail "no startup line"
echo "a. packed ($G windows) against unpacked ($n_docs documents), CPU fp32, step 1:"
close cpu_packed cpu_unpacked 1e-5 1e-5

# b. Isolation.
train "$ft" isolated data.train="$tmp/isolated"
train "$ft" mutated data.train="$tmp/mutated"
echo "b. one document's tokens changed, its targets masked out:"
close mutated isolated 1e-6 1e-6

# c. Resume and layouts, over 4 steps of shuffled windows.
four=(training.steps=4 data.shuffle=true)
train "$ft" unbroken "${four[@]}"
# SIGKILL as step 3 begins (the subshell keeps bash's "Killed" notice off the output).
(FT_TEST_KILL_AT_STEP=3 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/resumed" "${four[@]}" \
  > "$tmp/killed.log" 2>&1; exit $?) 2> /dev/null && fail "the killed run exited 0"
[[ -d $tmp/resumed/checkpoints/step_00000002 ]] || fail "no step-2 checkpoint: $(tail -3 "$tmp/killed.log")"
train "$ft" resumed "${four[@]}"
echo "c. killed after step 2 and resumed, against the unbroken run:"
close resumed unbroken 0 0
for layout in "tensor2 parallel.tensor=2" "pipeline2 parallel.pipeline=2" \
  "data2_z3 parallel.zero_stage=3"; do
  read -r name overrides <<< "$layout"
  # shellcheck disable=SC2086
  "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/$name" "${four[@]}" $overrides \
    runtime.threads=1 --nproc 2 > "$tmp/$name.log" 2>&1 || fail "$name: $(tail -5 "$tmp/$name.log")"
  echo "c. $name against one process:"
  close "$name" unbroken 1e-5 1e-5
done
# The start-up line comes once, from rank 0, as the other start-up lines do.
for name in tensor2 pipeline2 data2_z3; do
  n=$(grep -c 'ft: data.pack: ' "$tmp/$name.log" || true)
  [[ $n == 1 ]] || fail "$name printed the packing line $n times: $(grep 'ft: data' "$tmp/$name.log")"
done

# d. ft plan: the packed step's segment ids and positions are in the planned memory.
"$ft" plan "$tmp/r.yaml" --world 1 --json > "$tmp/plan.json" || fail "ft plan"
/usr/bin/python3 - "$tmp/plan.json" "$tmp/cpu_packed/metrics.jsonl" <<'PY' || fail "plan differs from the measured packed step"
import json, sys
role = json.load(open(sys.argv[1]))["roles"][0]
m = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l][-1]
assert role["peak_bytes"] == m["mem_peak_bytes"], (role["peak_bytes"], m["mem_peak_bytes"])
print(f"d. ft plan: planned peak == measured peak == {m['mem_peak_bytes']} bytes")
PY

# e. ft inspect.
run_rc 0 "$ft" inspect "$tmp/packed" --seq-len $T
has_out "packing at seq_len $T"
has_out "efficiency:     $efficiency"
grep -q "ft: data.pack: 60 documents in 60 pieces, $efficiency of the window positions filled" \
  "$tmp/cpu_packed.log" || fail "no packing line at start-up: $(grep '^ft: data' "$tmp/cpu_packed.log")"

# f. Validation.
sed 's/pack: true}/pack: true, pack_overflow: truncate}/' "$tmp/r.yaml" > "$tmp/bad.yaml"
run_rc 2 "$ft" validate "$tmp/bad.yaml"
grep -q "bad.yaml:3.*data.pack_overflow" "$tmp/err.txt" || fail_showing_output "no file:line: key for a bad pack_overflow"

# g. The emulated CUDA device, fused attention.
if [[ -x $emu ]]; then
  hd64=(runtime.device=cuda model.dim=128 model.n_heads=2 model.n_kv_heads=1 training.precision=bf16)
  train "$emu" emu_packed "${hd64[@]}"
  grep -q 'cuda:0 (CUDA emulation (test tool)' "$tmp/emu_packed.log" \
    || fail "emu_packed did not run on the emulated CUDA device: $(grep -m1 'ft: data' "$tmp/emu_packed.log")"
  train "$emu" emu_unpacked "${hd64[@]}" data.train="$tmp/unpacked" data.pack=false \
    training.global_batch_size="$n_docs"
  echo "g. packed against unpacked on the emulated CUDA device (bf16, fused attention), step 1:"
  close emu_packed emu_unpacked 1e-4 1e-3
  # Another shape has no attention that masks documents on CUDA: fp32 at this recipe's head
  # dim 8 (dim 32 / 4 heads) is refused by ft validate (runtime.device cuda, and auto where the
  # emulated GPU is usable) and by ft train before it reads any data (its output folder is not
  # made, no step runs), naming the keys; fp32 at head dim 64 too.
  for dev in cuda auto; do
    run_rc 2 "$emu" validate "$tmp/r.yaml" runtime.device=$dev
    has_err "r.yaml:3:"
    has_err "data.pack: true on the CUDA device (runtime.device: $dev"
    has_err "needs the fused attention kernel"
    has_err "training.precision fp32 and head dim 8 (model.dim 32 / model.n_heads 4)"
    has_err "(hint: training.precision: bf16"
  done
  run_rc 2 "$emu" validate "$tmp/r.yaml" runtime.device=cuda model.dim=128 model.n_heads=2 \
    model.n_kv_heads=1
  has_err "training.precision fp32 and head dim 64 (model.dim 128 / model.n_heads 2)"
  run_rc 0 "$emu" validate "$tmp/r.yaml" "${hd64[@]}"
  run_rc 0 "$emu" validate "$tmp/r.yaml" runtime.device=cpu
  run_rc 2 "$emu" train "$tmp/r.yaml" runtime.device=cuda run.output_dir="$tmp/emu_fp32"
  has_err "data.pack: true on the CUDA device (runtime.device: cuda"
  lacks_out "ft: data"
  [[ ! -e $tmp/emu_fp32 ]] || fail "the refused run made its output folder"
  # The trainer's own check, on the device it made: the fused shape, with FT_CUDA_ATTENTION
  # choosing the chunked GEMMs (the recipe is fine; that device's attention cannot mask).
  FT_CUDA_ATTENTION=gemm run_rc 2 "$emu" train "$tmp/r.yaml" "${hd64[@]}" \
    run.output_dir="$tmp/emu_gemm"
  has_err "data.pack: true on cuda:0"
  has_err "document segments need the fused attention kernel"
  has_err "FT_CUDA_ATTENTION=gemm"
  has_err "training.precision bf16 and head dim 64 (model.dim 128 / model.n_heads 2)"
  lacks_out "ft: data"
  [[ ! -e $tmp/emu_gemm ]] || fail "the refused run made its output folder"
  # Two ranks agree and stop alike: rank 0 says it once.
  FT_CUDA_ATTENTION=gemm run_rc 2 "$emu" train "$tmp/r.yaml" "${hd64[@]}" \
    run.output_dir="$tmp/emu_gemm2" runtime.communicator=mpi runtime.threads=1 --nproc 2
  n=$(cat "$tmp/out.txt" "$tmp/err.txt" | grep -c 'data.pack: true on cuda:0' || true)
  [[ $n == 1 ]] || fail_showing_output "two ranks: the refusal printed $n times"
  echo "g. refused up front: $(head -c 300 "$tmp/err.txt")"
else
  echo "g. skipped: this build has no ft_emu"
fi
echo "test_packing: OK"
