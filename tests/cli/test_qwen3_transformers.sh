#!/usr/bin/env bash
# qwen3 (model.arch, DESIGN.md §5) against transformers' own Qwen3ForCausalLM, which
# test_archs.sh and test_generate.sh cannot run: their venv has transformers 4.46.3 (no Qwen3) on
# Debian's torch 1.13, and every transformers with Qwen3 refuses that torch (4.51.x imports
# torch.distributed.tensor, which 1.13 lacks; from 4.52 on, transformers disables PyTorch below
# 2.1). So this test's venv takes torch from PyPI (its Linux wheel brings the CUDA runtime
# libraries as packages, which torch loads at import even on a CPU: about 2.8 GB to download,
# 5.3 GB installed, made once per build folder) with transformers 5's pins from common.sh.
# On small random models built by Qwen3ForCausalLM (untied and tied embeddings, head_dim 32):
# tests/ref/arch_parity.py (step-1 loss and every gradient, 10 training steps, the export loaded
# back by AutoModelForCausalLM as Qwen3ForCausalLM, with llama_ref checked against the same
# weights) and tests/ref/generate_parity.py (greedy 32 tokens equal Qwen3ForCausalLM.generate's
# and llama_ref's). Left out of the sanitizer pass: it compares numbers the Release pass
# compares, and test_archs.sh and test_generate.sh run ft's qwen3 there. FT_TEST_TORCH2=0
# skips it (no 2.8 GB download).
#   bash tests/cli/test_qwen3_transformers.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
fail() { fail_showing_output "$@"; }

if sanitizer_build; then
  echo "$test_name: skipped in the sanitizer build (the Release pass runs it)"
  exit 0
fi
if [[ ${FT_TEST_TORCH2:-1} == 0 ]]; then
  echo "$test_name: skipped, FT_TEST_TORCH2=0 (qwen3 is not compared with Qwen3ForCausalLM)"
  exit 0
fi
venv "$build/hf_venv_torch2" "${hf_torch2_spec[@]}"
py="$build/hf_venv_torch2/bin/python"
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers",
transformers.__version__, transformers.Qwen3ForCausalLM.__name__)' ||
  fail "torch or transformers' Qwen3ForCausalLM does not import in $build/hf_venv_torch2"

mkdir "$tmp/archs" "$tmp/generate"
run_rc 0 env FT_QWEN3_TRANSFORMERS=1 FT_ARCH_CASES=qwen3,qwen3_tied \
  "$py" "$src/tests/ref/arch_parity.py" "$build" "$src" "$tmp/archs" "$py"
has_out "arch_parity: all checks passed"
for label in qwen3 qwen3_tied; do
  has_out "ok   $label: llama_ref's logits against Qwen3ForCausalLM's"
  has_out "ok   $label: step 1 loss ft"
  has_out "ok   $label: AutoModelForCausalLM loads the export as Qwen3ForCausalLM"
  has_out "ok   $label: Qwen3ForCausalLM's logits of the export against llama_ref's"
done
grep -E "against Qwen3|step 1 loss|10 steps|logits of the export" "$tmp/out.txt"
grep -q "tied embeddings" <("$ft" inspect "$tmp/archs/qwen3_tied/export") ||
  fail "qwen3_tied export is not tied"

run_rc 0 env FT_QWEN3_TRANSFORMERS=1 "$py" "$src/tests/ref/generate_parity.py" "$build" "$src" \
  "$tmp/generate"
has_out "generate_parity: all checks passed"
has_out "ok: qwen3: greedy 32 tokens on the CPU equal transformers' generate"
grep "^ok: " "$tmp/out.txt"
echo "test_qwen3_transformers: all checks passed"
