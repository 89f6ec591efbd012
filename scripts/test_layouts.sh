#!/usr/bin/env bash
# Every layout trains the same model (DESIGN.md §3): one recipe (a small Llama with GQA, fp32,
# 10 steps, AdamW with weight decay, active clipping, gradient accumulation, a loss mask,
# shuffled data, evaluation after steps 5 and 10) run in one process and under each layout;
# tests/ref/compare_layouts.py compares losses, evaluation losses, gradient norms and the final
# parameters (reassembled from every rank's slices) with the one-process run.
#   scripts/test_layouts.sh [BUILD_DIR]          # the whole matrix (24 runs, about a minute)
#   scripts/test_layouts.sh --ci [BUILD_DIR]     # a subset: every axis, every ZeRO stage,
#                                                # one 3-D layout
#   scripts/test_layouts.sh --tcp ...            # ranks talk over TCP only (--mca btl tcp,self),
#                                                # standing in for separate nodes
#   scripts/test_layouts.sh --precision bf16 ... # every run in that training.precision (the
#                                                # comparison's bounds follow it)
#   scripts/test_layouts.sh --arch qwen3 ...     # the model in that model.arch, and only
#                                                # tensor 2, pipeline 2 and data 2 with ZeRO-3
#                                                # (tests/cli/test_layouts_archs.sh)
#   scripts/test_layouts.sh --set KEY=VALUE ...  # a recipe override for every run
#   scripts/test_layouts.sh --freeze GROUPS ...  # those parameter groups frozen in every run
#                                                # (FT_TEST_FREEZE, e.g. embed,layers.1), and
#                                                # tensor 2, pipeline 2, data 2 with ZeRO-2 and
#                                                # data 2 × tensor 2 with ZeRO-3 only
#                                                # (tests/cli/test_freeze.sh)
#   scripts/test_layouts.sh --lora ...           # a LoRA adapter (r 4, alpha 8, all-linear) on
#                                                # the frozen base in every run, and the layouts
#                                                # of --freeze (tests/cli/test_lora.sh)
#   scripts/test_layouts.sh --qlora ...          # a QLoRA adapter (the base's blocks in NF4)
#                                                # in every run, and pipeline 2 and data 2 with
#                                                # ZeRO-2 only (tests/cli/test_qlora.sh)
#   scripts/test_layouts.sh --dpo ...            # DPO (training.objective dpo, beta 0.5) on
#                                                # preference pairs, and only tensor 2,
#                                                # pipeline 2 and data 2 with ZeRO-3 (with
#                                                # --lora: the layouts of --lora)
#                                                # (tests/cli/test_dpo.sh)
#   scripts/test_layouts.sh --only A,B ...       # only the layouts of the whole matrix so named
#                                                # (e.g. tensor2_pipeline2)
# Layouts (data × tensor × pipeline, ZeRO stage for data > 1): data 2, data 4, tensor 2,
# pipeline 2, pipeline 3 (4 layers: 2+1+1), data 2 × tensor 2, data 2 × pipeline 2,
# tensor 2 × pipeline 2, data 2 × tensor 2 × pipeline 2.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
subset=all
tcp=0
precision=fp32
arch=llama
sets=()
only=
dpo=0
while [[ ${1:-} == --* ]]; do
  case $1 in
    --ci) subset=ci ;;
    --tcp) tcp=1 ;;
    --precision) precision=$2; shift ;;
    --arch) arch=$2; subset=arch; shift ;;
    --set) sets+=("$2"); shift ;;
    --only) only=$2; shift ;;
    --dpo) dpo=1; sets+=(training.objective=dpo dpo.beta=0.5)
           [[ $subset != all ]] || subset=arch ;;
    --freeze) export FT_TEST_FREEZE=$2; subset=few; shift ;;
    --lora) sets+=(adapter.type=lora adapter.r=4 adapter.alpha=8 adapter.target_modules=all-linear)
            subset=few ;;
    --qlora) sets+=(adapter.type=qlora adapter.r=4 adapter.alpha=8
                    adapter.target_modules=all-linear)
             subset=qlora ;;
    *) echo "usage: scripts/test_layouts.sh [--ci] [--tcp] [--precision fp32|bf16]" \
            "[--arch llama|qwen2|qwen3|mistral] [--set KEY=VALUE] [--freeze GROUPS] [--lora]" \
            "[--qlora] [--dpo]" \
            "[--only LAYOUT,...]" \
            "[BUILD_DIR]" >&2
       exit 2 ;;
  esac
  shift
done
build=$(cd "${1:-$src/build}" && pwd)
ft="$build/ft"
tmp=$(mktemp -d); trap '[[ -n ${KEEP:-} ]] || rm -rf "$tmp"' EXIT
mpirun_args=(--oversubscribe)
[[ $(id -u) == 0 ]] && mpirun_args+=(--allow-run-as-root)
((tcp)) && mpirun_args+=(--mca btl tcp,self)
[[ -n ${FT_TEST_FREEZE:-} ]] && mpirun_args+=(-x FT_TEST_FREEZE)
# Sanitizer builds: Open MPI's plugins keep allocations until exit (see mpi_env in
# tests/cli/common.sh).
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"

if ((dpo)); then  # 2 shards of 11 pairs: 22 per epoch, so batches of 8 straddle epochs
  # and a validation set of its own (evaluation reads another reference table).
  /usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" "$tmp/dpo_valid:1" --vocab 64 \
    --pairs 11 --seed 11
  sets+=(data.valid="$tmp/dpo_valid")
else
  /usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 41 --seq-len 12 --seed 11 --mask 0.8
fi
cat > "$tmp/r.yaml" <<YAML
run: {name: layouts, output_dir: $tmp/out, seed: 5}
model: {arch: $arch, dim: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 16}
data: {train: $tmp/data, valid: $tmp/data, seq_len: 12, shuffle: true}
training: {steps: 10, micro_batch_size: 1, global_batch_size: 8, grad_clip: 0.3, eval_every_steps: 5,
           eval_batches: 2, precision: $precision}
optimizer: {lr: 0.01, weight_decay: 0.1}
scheduler: {name: cosine, warmup_steps: 2}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

run() {  # name, ranks, overrides...
  local name=$1 ranks=$2; shift 2
  set -- "$@" ${sets[@]+"${sets[@]}"}
  local t0=$(date +%s%N)
  if [[ $ranks == 1 ]]; then
    FT_TEST_DUMP_PARAMS="$tmp/$name/params" "$ft" train "$tmp/r.yaml" "$@" run.output_dir="$tmp/$name" \
      > "$tmp/$name.log" 2>&1
  else
    FT_TEST_DUMP_PARAMS="$tmp/$name/params" mpirun "${mpirun_args[@]}" -x FT_TEST_DUMP_PARAMS \
      -np "$ranks" "$ft" train "$tmp/r.yaml" "$@" run.output_dir="$tmp/$name" > "$tmp/$name.log" 2>&1
  fi || { echo "FAIL: $name: $(tail -5 "$tmp/$name.log")" >&2; exit 1; }
  printf '%-28s %d ranks  %6d ms\n' "$name" "$ranks" $(( ($(date +%s%N) - t0) / 1000000 ))
  echo "$name" >> "$tmp/layouts.txt"
}

run single 1
layouts=()
[[ -n $only ]] && subset=all
if [[ $subset == arch ]]; then
  layouts=("tensor2 2 parallel.tensor=2" "pipeline2 2 parallel.pipeline=2"
           "data2_z3 2 parallel.zero_stage=3")
elif [[ $subset == few ]]; then
  layouts=("tensor2 2 parallel.tensor=2" "pipeline2 2 parallel.pipeline=2"
           "data2_z2 2 parallel.zero_stage=2"
           "data2_tensor2_z3 4 parallel.tensor=2 parallel.zero_stage=3")
elif [[ $subset == qlora ]]; then  # NF4 blocks are whole on a rank: no tensor 2, no ZeRO-3
  layouts=("pipeline2 2 parallel.pipeline=2" "data2_z2 2 parallel.zero_stage=2")
elif [[ $subset == ci ]]; then
  layouts=("data2_z1 2 parallel.zero_stage=1"
           "tensor2 2 parallel.tensor=2"
           "pipeline3 3 parallel.pipeline=3"
           "data2_pipeline2_z2 4 parallel.pipeline=2 parallel.zero_stage=2"
           "tensor2_pipeline2 4 parallel.tensor=2 parallel.pipeline=2"
           "data2_tensor2_z3 4 parallel.tensor=2 parallel.zero_stage=3"
           "data2_tensor2_pipeline2_z0 8 parallel.tensor=2 parallel.pipeline=2 parallel.zero_stage=0")
else
  for z in 0 1 2 3; do
    layouts+=("data2_z$z 2 parallel.zero_stage=$z" "data4_z$z 4 parallel.zero_stage=$z"
              "data2_tensor2_z$z 4 parallel.tensor=2 parallel.zero_stage=$z"
              "data2_pipeline2_z$z 4 parallel.pipeline=2 parallel.zero_stage=$z"
              "data2_tensor2_pipeline2_z$z 8 parallel.tensor=2 parallel.pipeline=2 parallel.zero_stage=$z")
  done
  layouts+=("tensor2 2 parallel.tensor=2" "pipeline2 2 parallel.pipeline=2"
            "pipeline3 3 parallel.pipeline=3" "tensor2_pipeline2 4 parallel.tensor=2 parallel.pipeline=2")
fi
for l in "${layouts[@]}"; do
  [[ -z $only || ,$only, == *,${l%% *},* ]] || continue
  # shellcheck disable=SC2086
  run $l
done

/usr/bin/python3 "$src/tests/ref/compare_layouts.py" "$tmp" "$src" "$precision"
