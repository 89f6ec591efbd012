#!/usr/bin/env bash
# Makes the CLI tests' Python venvs under BUILD_DIR before the suite needs them (common.sh: venv,
# and hf_tf4_spec, hf_peft_spec, hf_tf5_spec, hf_torch2_spec, tensorboard_spec), so that their
# downloads from PyPI overlap the build instead of holding a ctest slot (scripts/test.sh starts
# this in the background of its release-build stage). A test finds its venv made, or waits on its
# lock while this makes it. FT_TEST_TORCH2=0 leaves out torch 2 (as test_qwen3_transformers and
# test_lora_peft's qwen3 do); the sanitizer build, where those tests and test_lora_peft skip, leaves
# out torch 2 and PEFT.
#   bash tests/cli/make_venvs.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
t0=$SECONDS
venv "$build/hf_venv_tf4" "${hf_tf4_spec[@]}"
venv "$build/hf_venv_tf5" "${hf_tf5_spec[@]}"
venv "$build/tensorboard_venv" "${tensorboard_spec[@]}"
if ! sanitizer_build; then
  venv "$build/hf_venv_peft" "${hf_peft_spec[@]}"
fi
if [[ ${FT_TEST_TORCH2:-1} != 0 ]] && ! sanitizer_build; then
  venv "$build/hf_venv_torch2" "${hf_torch2_spec[@]}"
fi
echo "make_venvs: the venvs under $build are ready ($((SECONDS - t0)) s)"
