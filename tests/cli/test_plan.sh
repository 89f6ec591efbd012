#!/usr/bin/env bash
# ft plan (DESIGN.md §4): its memory figures against what real runs measure. The plan runs each
# rank's real setup and one step on a counting device (lib/train/plan.h), so it must equal the
# measurement to the byte:
#  - `--nproc 2` runs for ZeRO stages 0–3, tied embeddings + activation checkpointing under
#    ZeRO-3, and tensor parallelism (2 tensor ranks; 2 data × 2 tensor under ZeRO-3 with
#    `--nproc 4`); pipeline layouts: 3 layers on 2 stages (uneven split), tied embeddings +
#    activation checkpointing, 2 data × 2 pipeline under ZeRO 1, 2 and 3, 2 tensor × 2 pipeline,
#    3 stages with fewer micro-batches than stages, and 2 × 2 × 2 under ZeRO-3; 2 data × 2
#    pipeline evaluating data.valid after every step (each evaluation runs the whole global
#    batch, twice the step's micro-batches per rank, through the stages: the steps after it
#    measure its peak too, and every stage's plan counts it); bf16 and fp16:
#    rank 0's planned params/grads/optimizer bytes equal the metrics' mem_params/grads/optim_bytes,
#    and the planned peak (max of the step's, start-up's, evaluation's and DPO's reference pass
#    before step 1; DPO with reference initial under 2 data × 2 pipeline ZeRO-3 evaluating, and
#    with reference base and LoRA under tensor 2) equals mem_peak_bytes,
#    the device allocator's peak over the run; every allocation says what it is for
#    (other_bytes 0). Only rank 0 writes metrics and it is always on the first pipeline stage:
#    the other stages' parameter counts are checked against the tensors every rank of data
#    rank 0 writes with FT_TEST_DUMP_PARAMS, and their figures in tests/unit/test_plan.cpp
#    against hand-worked ones.
#    Two of the layouts run on the guard device too (the same figures).
#  - Host memory (Device::alloc_host, alloc_pageable): every run's planned pinned and pageable
#    peaks equal the metrics' mem_host_pinned_bytes and mem_host_pageable_bytes, and, by hand,
#    checkpoint.async's page-locked staging (12 B per element of the rank's ZeRO cut), a
#    synchronous save's pageable copy of its largest piece, model.from's pageable read buffer
#    (the largest group's tensor slice, from a folder ft export wrote).
#  - Before the download: a Qwen2.5-7B folder holding config.json alone plans (its read buffer
#    the head group, 3584 + 152064 × 3584 fp32), and ft train and ft validate refuse it (exit 2);
#    --host-mem-gb flags a node that needs more, and a node's need is its ranks' summed.
#  - The tables: one per rank role; a world that does not fit the layout is a usage error
#    (exit 2).
#   bash tests/cli/test_plan.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
mpi_env

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data:1" --vocab 61 --samples 40 \
  --seq-len 16 --seed 3
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/pairs:1" --vocab 61 --pairs 20 --seed 4

cat > "$tmp/r.yaml" <<YAML
run: {name: plan, output_dir: $tmp/out, seed: 1}
model: {dim: 40, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 44, vocab_size: 64, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 16}
training: {steps: 3, micro_batch_size: 2, global_batch_size: 8}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

# name:ranks:overrides
runs=()
for z in 0 1 2 3; do runs+=("z$z:2:parallel.zero_stage=$z"); done
runs+=("tied_ckpt_z3:2:parallel.zero_stage=3 model.tie_embeddings=true training.activation_checkpointing=true"
       "tensor2:2:parallel.tensor=2"
       "data2_tensor2_z3:4:parallel.tensor=2 parallel.zero_stage=3"
       "pipe2_uneven:2:parallel.pipeline=2 model.n_layers=3"
       "pipe2_tied_ckpt:2:parallel.pipeline=2 model.n_layers=3 model.tie_embeddings=true training.activation_checkpointing=true"
       "data2_pipe2_z1:4:parallel.pipeline=2 parallel.zero_stage=1 model.n_layers=3"
       "data2_pipe2_z2_tied:4:parallel.pipeline=2 parallel.zero_stage=2 model.n_layers=3 model.tie_embeddings=true"
       "data2_pipe2_z3_tied:4:parallel.pipeline=2 parallel.zero_stage=3 model.n_layers=3 model.tie_embeddings=true"
       "tensor2_pipe2:4:parallel.tensor=2 parallel.pipeline=2 model.n_layers=3"
       "pipe3_m2:3:parallel.pipeline=3 model.n_layers=4 training.global_batch_size=4"
       "data2_pipe2_tensor2_z3:8:parallel.tensor=2 parallel.pipeline=2 parallel.zero_stage=3 model.tie_embeddings=true"
       "data2_pipe2_eval:4:parallel.pipeline=2 model.n_layers=3 data.valid=$tmp/data training.eval_every_steps=1")
# The precision policy (fp32 masters, a 16-bit compute copy and activations): ZeRO 0 and 3, and
# tensor x pipeline.
for p in bf16 fp16; do
  runs+=("${p}_z0:2:parallel.zero_stage=0 training.precision=$p"
         "${p}_z3:2:parallel.zero_stage=3 training.precision=$p")
done
runs+=("bf16_z1:2:parallel.zero_stage=1 training.precision=bf16"
       "bf16_tensor2_pipe2:4:parallel.tensor=2 parallel.pipeline=2 model.n_layers=3 training.precision=bf16")
# Host memory: checkpoint.async's page-locked staging; a synchronous save's pageable copy of a
# piece; model.from's pageable read buffer (from_hf_tensor2, below, reads a folder exported from
# ckpt_sync_z0's checkpoint).
runs+=("ckpt_async_z1:2:parallel.zero_stage=1 checkpoint.every_steps=1 checkpoint.async=true checkpoint.dir=$tmp/ckpt_async_z1/ck"
       "ckpt_sync_z0:2:parallel.zero_stage=0 checkpoint.every_steps=1 checkpoint.dir=$tmp/ckpt_sync_z0/ck")
# DPO (two rows a pair): reference initial, its pass before step 1 counted (2 data × 2 pipeline
# under ZeRO-3, evaluating); reference base, its pass in every step (LoRA, tensor 2).
dpo="training.objective=dpo data.train=$tmp/pairs"
runs+=("dpo_data2_pipe2_z3_eval:4:parallel.pipeline=2 parallel.zero_stage=3 model.n_layers=3 $dpo data.valid=$tmp/pairs training.eval_every_steps=1"
       "dpo_lora_base_tensor2:2:parallel.tensor=2 $dpo dpo.reference=base adapter.type=lora adapter.r=4 adapter.alpha=8 adapter.target_modules=all-linear")
names=()
# The guard device (FT_TEST_GUARD_DEVICE, device memory closed to the host, host-staged MPI)
# allocates what the CPU does: ZeRO-3 and tensor × pipeline under it.
runs+=("guard_z3:2:parallel.zero_stage=3 training.precision=bf16"
       "guard_tensor2_pipe2:4:parallel.tensor=2 parallel.pipeline=2 model.n_layers=3")
train_and_plan() {  # name:ranks:overrides
  local name n overrides ov guard=0
  IFS=: read -r name n overrides <<< "$1"; read -r -a ov <<< "$overrides"
  [[ $name == guard_* ]] && guard=1
  FT_TEST_GUARD_DEVICE=$guard FT_TEST_DUMP_PARAMS="$tmp/$name.params" \
    "$ft" train "$tmp/r.yaml" "${ov[@]}" run.output_dir="$tmp/$name" --nproc "$n" > "$tmp/$name.log" 2>&1 \
    || fail "train $name: $(tail -5 "$tmp/$name.log")"
  "$ft" plan "$tmp/r.yaml" "${ov[@]}" --world "$n" --json > "$tmp/$name.plan.json" \
    || fail "plan $name"
  names+=("$name")
}
for run in "${runs[@]}"; do train_and_plan "$run"; done
"$ft" export "$tmp/ckpt_sync_z0/ck" --output "$tmp/hf" > "$tmp/export.log" 2>&1 \
  || fail "export: $(cat "$tmp/export.log")"
train_and_plan "from_hf_tensor2:2:parallel.tensor=2 model.from=$tmp/hf"

/usr/bin/python3 - "$tmp" "${names[@]}" <<'PY' || fail "plan disagrees with the measured metrics"
import glob, json, math, os, struct, sys
tmp, names = sys.argv[1], sys.argv[2:]

def dumped_elements(path):  # elements of the tensors in a safetensors file
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")

for name in names:
    m = [json.loads(l) for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l][-1]
    plan = json.load(open(f"{tmp}/{name}.plan.json"))
    role = next(r for r in plan["roles"] if 0 in r["ranks"])  # metrics come from rank 0
    pairs = [(k, role[f"{k}_bytes"], m[f"mem_{k}_bytes"]) for k in ("params", "grads", "optim")]
    pairs.append(("peak", role["peak_bytes"], m["mem_peak_bytes"]))
    line = []
    # Host memory (Device::alloc_host, alloc_pageable): the guard device's runs also stage
    # their MPI calls through page-locked host memory, which a plan does not count (its
    # communicators stage nothing; DESIGN.md §4 "Host memory").
    if not name.startswith("guard_"):
        pairs += [(f"host {k}", role["host_bytes"][k], m[f"mem_host_{k}_bytes"])
                  for k in ("pinned", "pageable")]
    for what, planned, measured in pairs:
        assert planned == measured, (name, what, planned, measured)
        line.append(f"{what} {planned}")
    # Which host memory, by hand: dim 40, ffn 44, 2 kv heads of 10: a layer holds 2·40 + 40·40 +
    # 2·20·40 + 40·40 + 3·44·40 = 10160 elements, the largest group; the embedding 2560, the
    # head 40 + 2560.
    hb, layer = role["host_bytes"], 10160
    want = {"ckpt_async_z1": ({"checkpoint": 12 * role["trained_elems"] // 2}, {}),  # ZeRO cut of 2
            "ckpt_sync_z0": ({}, {"checkpoint": 4 * layer // 2}),  # the largest piece
            # tensor 2: a layer's slice 80 + (1600 + 800 + 800 + 1600 + 5280) / 2
            "from_hf_tensor2": ({}, {"parameters": 4 * (80 + 10080 // 2)})}.get(name, ({}, {}))
    assert (hb["pinned_by_category"], hb["pageable_by_category"]) == want, (name, hb, want)
    assert role["peak_bytes"] == max(role["total_bytes"], role["startup_bytes"],
                                     role["eval_bytes"], role["reference_bytes"]), (name, role)
    assert (role["reference_bytes"] > 0) == name.startswith("dpo_data2"), (name, role)
    evals = [l for l in open(f"{tmp}/{name}/metrics.jsonl") if '"eval_loss"' in l]
    for r in plan["roles"]:
        assert r["other_bytes"] == 0, (name, "allocations without a category", r)
        # Evaluating runs (the run evaluated after every step, so its later steps' peak covers
        # the evaluations before them): every stage plans a validation batch of
        # global_batch_size / micro_batch_size forward micro-batches; the others plan none.
        if "eval" in name:
            assert len(evals) == 3, (name, "evaluations", evals)
            assert r["eval_micro_batches"] == 4 and r["eval_bytes"] > 0, (name, r)
        else:
            assert r["eval_bytes"] == 0 and not evals, (name, r)
        parts = sum(r[k] for k in ("params_bytes", "grads_bytes", "optim_bytes",
                                   "activation_bytes", "comm_buffer_bytes", "backend_bytes"))
        assert parts == r["total_bytes"], (name, "categories do not add up", r)
    # Every rank of data rank 0 (every stage and tensor rank) dumped the parameters it holds.
    dumps = glob.glob(f"{tmp}/{name}.params/rank_*.safetensors")
    assert dumps, (name, "no FT_TEST_DUMP_PARAMS files")
    held = []
    for path in sorted(dumps):
        rank = int(os.path.basename(path)[5:-12])
        role = next(r for r in plan["roles"] if rank in r["ranks"])
        got = dumped_elements(path)
        assert got == role["param_elems"], (name, rank, "param elements", role["param_elems"], got)
        held.append(f"{rank}:{got}")
    line.append("elements held " + " ".join(held))
    print(f"{name}: planned = measured bytes: " + ", ".join(line))
PY

# The tables: one role for two identical ranks, every figure and the notes printed.
"$ft" plan "$tmp/r.yaml" parallel.zero_stage=2 --world 2 > "$tmp/table.txt" || fail "plan table"
for want in 'ranks 0-1 ' parameters gradients 'optimizer state' activations 'comm buffers' total \
            'allocations counted' 'sent per step' 'reduce-scatter' Notes 'counting device' \
            'host pinned' 'host pageable' 'host peak' 'Host memory is counted'; do
  grep -q "$want" "$tmp/table.txt" || fail "table lacks '$want': $(cat "$tmp/table.txt")"
done

# 8 ranks as 2 data × 2 pipeline × 2 tensor give one role per pipeline stage, with the stage's
# activation slots and pipeline buffers; pipeline figures are no longer called estimates.
"$ft" plan "$tmp/r.yaml" parallel.tensor=2 parallel.pipeline=2 --world 8 > "$tmp/tp.txt" \
  || fail "tensor/pipeline plan: $(cat "$tmp/tp.txt")"
grep -q '^ranks 0-1, 4-5 ' "$tmp/tp.txt" || fail "stage 0 role: $(cat "$tmp/tp.txt")"
grep -q '^ranks 2-3, 6-7 ' "$tmp/tp.txt" || fail "stage 1 role: $(cat "$tmp/tp.txt")"
grep -q '2 slots (micro-batches in flight)' "$tmp/tp.txt" || fail "no activation slots: $(cat "$tmp/tp.txt")"
grep -q 'pipeline send/receive buffers' "$tmp/tp.txt" || fail "no pipeline buffers: $(cat "$tmp/tp.txt")"
grep -q 'send .* B (group of 2)' "$tmp/tp.txt" || fail "no pipeline sends: $(cat "$tmp/tp.txt")"
! grep -qi 'estimate\|cannot run' "$tmp/tp.txt" || fail "pipeline still called an estimate: $(cat "$tmp/tp.txt")"

# A Llama-3-70B shape on 64 ranks (recipes/llama3_70b.yaml: 8 tensor × 4 pipeline × 2 data,
# bf16, ZeRO-1, activation checkpointing): the plan counts 64 ranks' setups and steps of a 70.6B-parameter model without
# allocating it: the process stays small (the model's bf16 copy alone is 141 GB). Its time is a
# benchmark's business (scripts/bench_plan.sh), not this test's.
/usr/bin/time -f '%M' -o "$tmp/rss.txt" "$ft" plan "$src/recipes/llama3_70b.yaml" \
  run.output_dir="$tmp/l70" --world 64 --json \
  > "$tmp/l70.json" || fail "70B plan"
rss_kb=$(tail -1 "$tmp/rss.txt")
(( rss_kb < 1000000 )) || fail "planning the 70B model used ${rss_kb} KiB of memory"
/usr/bin/python3 - "$tmp/l70.json" <<'PY' || fail "70B plan figures"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["world"] == 64 and p["model_params"] > 70e9, p["model_params"]
roles = p["roles"]
assert len(roles) == 4, [r["ranks"] for r in roles]  # one per pipeline stage
for r in roles:
    assert len(r["ranks"]) == 16 and r["other_bytes"] == 0, r
    assert 20e9 < r["total_bytes"] < 80e9, r["total_bytes"]  # tens of GB: what a GPU holds
print("70B at world 64: " + ", ".join(f"stage {r['pipeline_stage']} {r['total_bytes'] / 2**30:.1f} GiB"
                                       for r in roles))
PY

# Before the download: a Qwen2.5-7B folder that holds config.json alone plans (bf16, seq 4096,
# activation checkpointing, one GPU); ft train and ft validate refuse it as before (exit 2). The
# plan's pageable host memory is model.from's read buffer: the largest group, the head (the final
# norm, 3584, and the untied lm_head, 152064 × 3584), in fp32.
mkdir -p "$tmp/qwen7b"
cat > "$tmp/qwen7b/config.json" <<'JSON'
{"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
 "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
 "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
 "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
 "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
 "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
 "use_cache": true, "use_sliding_window": false, "vocab_size": 152064}
JSON
cat > "$tmp/q.yaml" <<YAML
run: {name: qwen7b, output_dir: $tmp/q_out}
model: {from: $tmp/qwen7b}
data: {train: $tmp/data, seq_len: 4096}
training: {steps: 10, micro_batch_size: 1, global_batch_size: 1, precision: bf16,
           activation_checkpointing: true}
runtime: {device: cuda}
YAML
"$ft" plan "$tmp/q.yaml" --json > "$tmp/q.json" 2> "$tmp/q.err" || fail "config-only plan: $(cat "$tmp/q.err")"
"$ft" plan "$tmp/q.yaml" --host-mem-gb 1 --gpus-per-node 1 --json > "$tmp/q_small.json" \
  2> "$tmp/q_small.err" || fail "plan --host-mem-gb 1: $(cat "$tmp/q_small.err")"
"$ft" plan "$tmp/q.yaml" --host-mem-gb 64 > "$tmp/q_table.txt" 2> "$tmp/q_big.err" \
  || fail "plan --host-mem-gb 64"
grep -q 'more than --host-mem-gb 1$' "$tmp/q_small.err" || fail "--host-mem-gb 1 not flagged: $(cat "$tmp/q_small.err")"
[[ ! -s "$tmp/q_big.err" ]] || fail "--host-mem-gb 64 flagged: $(cat "$tmp/q_big.err")"
grep -q 'host peak .*within --host-mem-gb 64 GiB' "$tmp/q_table.txt" || fail "table: $(grep host "$tmp/q_table.txt")"
/usr/bin/python3 - "$tmp" <<'PY' || fail "config-only plan figures"
import json, sys
tmp = sys.argv[1]
p = json.load(open(f"{tmp}/q.json"))
r = p["roles"][0]
assert p["model_params"] == 7615616512, p["model_params"]  # Qwen2.5-7B's count
assert p["device"] == "cuda" and r["other_bytes"] == 0, r
hb = r["host_bytes"]
assert hb["pageable_by_category"] == {"parameters": 4 * (3584 + 152064 * 3584)}, hb
assert hb["pinned"] == 0 and hb["peak"] == hb["need"] == hb["pageable"], hb
assert r["host_node_bytes"] == hb["need"] and "host_fits" not in r, r
small = json.load(open(f"{tmp}/q_small.json"))
assert small["host_mem_gb"] == 1 and small["host_fits"] is False, small.get("host_fits")
assert small["roles"][0]["host_fits"] is False
print(f"Qwen2.5-7B from config.json alone: peak {r['peak_bytes'] / 2**30:.1f} GiB on the GPU, "
      f"host {hb['peak'] / 2**30:.2f} GiB pageable (model.from's read buffer)")
PY
for cmd in train validate; do
  rc=0
  "$ft" $cmd "$tmp/q.yaml" runtime.device=cpu > "$tmp/q_$cmd.txt" 2>&1 || rc=$?
  [[ $rc == 2 ]] || fail "ft $cmd of a config-only folder: exit $rc, want 2: $(cat "$tmp/q_$cmd.txt")"
  grep -q "has no model.safetensors or model.safetensors.index.json" "$tmp/q_$cmd.txt" \
    || fail "ft $cmd of a config-only folder: $(cat "$tmp/q_$cmd.txt")"
done
# A node's host memory is its ranks' summed (--gpus-per-node 2: two ranks of 4 on each); on the
# CPU device a rank's need is its device and host memory at once.
"$ft" plan "$tmp/r.yaml" parallel.zero_stage=1 checkpoint.every_steps=1 checkpoint.async=true \
  --world 4 --gpus-per-node 2 --json > "$tmp/nodes.json" || fail "plan nodes"
/usr/bin/python3 - "$tmp/nodes.json" <<'PY' || fail "node host memory"
import json, sys
for r in json.load(open(sys.argv[1]))["roles"]:
    hb = r["host_bytes"]
    assert hb["pinned"] > 0 and hb["need"] >= r["total_bytes"] + hb["pinned"], r
    assert r["host_node_bytes"] == 2 * hb["need"], r
PY

# The data paths play no part in a plan; a world that does not fit the layout does (exit 2).
"$ft" plan "$tmp/r.yaml" data.train="$tmp/nowhere" > /dev/null || fail "plan needs the data"
rc=0
"$ft" plan "$tmp/r.yaml" parallel.tensor=2 --world 3 > /dev/null 2> "$tmp/err.txt" || rc=$?
[[ $rc == 2 ]] || fail "world 3 with tensor 2: exit $rc, want 2"
grep -q 'not divisible' "$tmp/err.txt" || fail "world error message: $(cat "$tmp/err.txt")"
# The time estimate (DESIGN.md §4 "Communication time"): each group's time follows from its
# counted bytes and calls and the flags; the links from the node size; hidden from the schedule.
tplan() { local out=$1; shift; "$ft" plan "$tmp/r.yaml" --json "$@" > "$tmp/$out.json" || fail "plan $out"; }
tplan t_z0 --world 2 parallel.zero_stage=0
tplan t_z0_bw2 --world 2 parallel.zero_stage=0 --nvlink-gbps 900 --latency-us 0
tplan t_z0_bw1 --world 2 parallel.zero_stage=0 --latency-us 0
tplan t_z0_slow --world 2 parallel.zero_stage=0 --tflops 1e-9       # a long backward hides it all
tplan t_z0_fast --world 2 parallel.zero_stage=0 --tflops 1e9        # a short one hides little
tplan t_z0_off --world 2 parallel.zero_stage=0 --tflops 1e-9 parallel.overlap_comm=false
tplan t_z3_slow --world 2 parallel.zero_stage=3 --tflops 1e-9
tplan t_z3_off --world 2 parallel.zero_stage=3 --tflops 1e-9 parallel.overlap_comm=false
tplan t_ib --world 2 parallel.zero_stage=0 --gpus-per-node 1 --ib-gbps 25
tplan t_pcie --world 2 parallel.zero_stage=0 --intra-node pcie --pcie-gbps 30
tplan t_tp --world 4 parallel.tensor=2 --gpus-per-node 2 --tflops 1e-9
/usr/bin/python3 - "$tmp" <<'PY' || fail "time estimate"
import json, math, sys
tmp = sys.argv[1]
def plan(name): return json.load(open(f"{tmp}/{name}.json"))
def role(name): return plan(name)["roles"][0]
def group(r, g): return next(x for x in r["time"]["groups"] if x["group"] == g)
close = lambda a, b: math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)

for name in ("t_z0", "t_z3_slow", "t_ib", "t_pcie", "t_tp"):
    p = plan(name)
    lat = p["links"]["latency_us"]
    for r in p["roles"]:
        t = r["time"]
        for g in t["groups"]:  # ms = bytes / bandwidth + calls x latency; exposed = ms - hidden
            assert close(g["ms"], g["bytes"] / (g["gbps"] * 1e6) + g["calls"] * lat / 1e3), (name, g)
            assert close(g["exposed_ms"], g["ms"] - g["hidden_ms"]) and g["hidden_ms"] >= 0, (name, g)
            key = {"tied embedding": "pipeline"}.get(g["group"], g["group"])
            if g["group"] != "tied embedding":
                assert g["bytes"] == r[f"sent_{key}_bytes"], (name, g, r[f"sent_{key}_bytes"])
        assert close(t["compute_ms"], t["flops"] / (p["links"]["tflops"] * 1e9)), (name, t)
        assert close(t["step_ms"], t["compute_ms"] + t["exposed_ms"]), (name, t)
        assert t["hidden_ms"] <= t["backward_window_ms"] * (1 + 1e-9), (name, t)

# FLOPs by hand (dim 40, 4 heads of 10, 2 kv heads, ffn 44, vocab 64, seq 16): per token and
# layer 40·40 + 2·40·20 + 40·40 + 3·40·44 = 10080 multiply-accumulates, attention 2·16·40 = 1280,
# the head 64·40 = 2560; 2 micro-batches of 2 × 16 tokens per data rank; 3 × the forward.
fwd = (2 * 2 * (10080 + 1280) + 2 * 2560) * 2 * 2 * 16
assert role("t_z0")["time"]["flops"] == 3 * fwd, (role("t_z0")["time"]["flops"], 3 * fwd)

# Doubling the bandwidth halves the time (no latency).
a, b = group(role("t_z0_bw1"), "data"), group(role("t_z0_bw2"), "data")
assert a["link"] == "NVLink" and a["gbps"] == 450 and close(a["ms"], 2 * b["ms"]) and a["ms"] > 0, (a, b)
# Links: one node of 8 (default): NVLink; --intra-node pcie: PCIe; a node per GPU: InfiniBand.
assert group(role("t_pcie"), "data")["link"] == "PCIe" and group(role("t_pcie"), "data")["gbps"] == 30
g = group(role("t_ib"), "data")
assert g["link"] == "InfiniBand" and g["gbps"] == 25, g
assert g["bytes"] == group(role("t_z0"), "data")["bytes"] > 0, g  # the same bytes, another link
# 2 GPUs per node, tensor 2 x data 2: the tensor pairs (0-1, 2-3) are on a node, the data
# pairs (0-2, 1-3) span two: NVLink and InfiniBand; tensor all-reduces are never hidden.
for r in plan("t_tp")["roles"]:
    assert group(r, "tensor")["link"] == "NVLink" and group(r, "data")["link"] == "InfiniBand", r
    assert group(r, "tensor")["hidden_ms"] == 0 and group(r, "tensor")["ms"] > 0, r
    assert group(r, "data")["hidden_ms"] > 0, r

# ZeRO-0 with a backward long enough: hidden = every layer's all-reduce but the embedding's
# (the backward ends there), 2·(2-1)/2 x 4 bytes per element, one call each (head, 2 layers).
r = role("t_z0_slow")
g, lat = group(r, "data"), 20e-3
want = 4 * (r["param_elems"] - 64 * 40) / (450 * 1e6) + 3 * lat
assert close(g["hidden_ms"], want), (g, want)
assert g["exposed_ms"] > lat, g  # the embedding's reduction and the scalars
# A short backward: hidden is the backward's compute time, no more.
t = role("t_z0_fast")["time"]
assert 0 < t["hidden_ms"] and close(t["hidden_ms"], t["backward_window_ms"]), t
# ZeRO-3: each micro-batch's reduce-scatters (2 x 4 groups, 4 bytes per element of a half)
# but the very last; its all-gathers stay exposed.
r = role("t_z3_slow")
g = group(r, "data")
want = (2 * 4 * r["param_elems"] / 2 - 4 * 64 * 40 / 2) / (450 * 1e6) + 7 * lat
assert close(g["hidden_ms"], want), (g, want)
# the all-gathers: each group's fp32 half at least once per micro-batch
assert g["exposed_ms"] > 2 * 4 * r["param_elems"] / 2 / (450 * 1e6), g
# overlap_comm false: nothing hidden, the same bytes.
for on, off in (("t_z0_slow", "t_z0_off"), ("t_z3_slow", "t_z3_off")):
    a, b = role(on)["time"], role(off)["time"]
    assert b["hidden_ms"] == 0 and a["hidden_ms"] > 0 and close(a["comm_ms"], b["comm_ms"]), (a, b)
    assert close(b["exposed_ms"], b["comm_ms"]), b
print("time estimate: ZeRO-0 data group %.4f ms, hidden %.4f; ZeRO-3 %.4f, hidden %.4f" % (
    group(role("t_z0_slow"), "data")["ms"], group(role("t_z0_slow"), "data")["hidden_ms"],
    group(role("t_z3_slow"), "data")["ms"], group(role("t_z3_slow"), "data")["hidden_ms"]))
PY
"$ft" plan "$tmp/r.yaml" --world 2 > "$tmp/ttable.txt" || fail "plan time table"
for want in 'time per step' 'exposed ms' 'NVLink 450 GB/s' '^  step ' 'Time (predicted'; do
  grep -q "$want" "$tmp/ttable.txt" || fail "table lacks '$want': $(cat "$tmp/ttable.txt")"
done

echo "test_plan: all checks passed"
