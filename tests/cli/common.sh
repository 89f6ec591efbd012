# Sourced by the CLI tests (not a test itself: ctest runs tests/cli/test_*.sh), first thing:
#   source "$2/tests/cli/common.sh" "$@"
# with the test's own BUILD_DIR SOURCE_DIR. It sets
#   build, src   the two, absolute;
#   ft           $build/ft;   emu: $build/tests/cuda_emu/ft_emu (see need_emu);
#   tmp          a fresh folder named after the test, removed at exit unless KEEP is set (to
#                look at after a failure: KEEP=1 bash tests/cli/test_x.sh build .);
#   fail MSG     prints FAIL: MSG and exits 1 (a test may define its own after sourcing);
# and gives need_emu, sanitizer_build and mpi_env below. A test with its own EXIT trap calls remove_tmp in it.
set -euo pipefail
test_name=$(basename "$0" .sh)
build=$(cd "${1:?usage: $0 BUILD_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: $0 BUILD_DIR SOURCE_DIR}" && pwd)
ft="$build/ft"
emu="$build/tests/cuda_emu/ft_emu"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ft_$test_name.XXXXXX")
remove_tmp() { [[ -n ${KEEP:-} ]] || rm -rf "$tmp"; }
trap remove_tmp EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# need_emu: the tests of the CUDA backend on the emulation pass as skipped (exit 0) in a build
# without ft_emu (FT_CUDA_EMU off, or no CUDA headers to build it against).
need_emu() {
  if [[ ! -x $emu ]]; then
    echo "$test_name: skipped, this build has no ft_emu (FT_CUDA_EMU off: no CUDA headers)"
    exit 0
  fi
}

# sanitizer_build: true in the sanitizer pass's build (FT_SANITIZE=ON). That pass looks for
# memory and undefined-behaviour errors; a test may leave out there what repeats code it has
# already run only to compare bits (another schedule seed: races are the Release pass's to find).
sanitizer_build() { grep -q '^FT_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; }

# Every mpirun a test starts, itself or through ft train --nproc or scripts/test_layouts.sh:
# PMIx's munge plugin, where munge is installed (the slurm stage installs it) but munged is not
# running, retries munged's socket with growing sleeps for 2.25 s before it falls back to native
# authentication (`mpirun -np 2 true`: 2.5 s against 0.2 s once tests/slurm has run and stopped
# munged). One node needs no munge.
export PMIX_MCA_psec="${PMIX_MCA_psec:-native}"

# mpi_env [MPIRUN_ARGS...]: for tests that run mpirun. Leak reports off in the sanitizer pass:
# Open MPI's dlopen'ed plugins keep allocations until exit, and once unloaded their stacks cannot
# be told apart for suppression; address and undefined-behaviour errors still fail the test.
# mpirun_args: --oversubscribe (CI has 2 cores), the arguments given, and --allow-run-as-root
# where the test runs as root (a container).
mpi_env() {
  export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
  mpirun_args=(--oversubscribe "$@")
  [[ $(id -u) != 0 ]] || mpirun_args+=(--allow-run-as-root)
}

# For tests of one command's exit code and output:
#   run_rc WANT_RC CMD...   runs CMD, stdout into $tmp/out.txt and stderr into $tmp/err.txt, and
#                           fails unless it exits WANT_RC;
#   has_out / has_err TEXT  that output has the fixed string TEXT; lacks_out TEXT: it has not;
#   fail_showing_output MSG fails as fail does, then prints both files (what a test's own fail
#                           calls when the last command's output explains the failure).
run_rc() {
  local want=$1 rc=0
  shift
  "$@" > "$tmp/out.txt" 2> "$tmp/err.txt" || rc=$?
  [[ $rc == "$want" ]] || fail "$* exited $rc, expected $want"
}
has_out() { grep -qF -- "$1" "$tmp/out.txt" || fail "stdout lacks: $1"; }
has_err() { grep -qF -- "$1" "$tmp/err.txt" || fail "stderr lacks: $1"; }
lacks_out() { if grep -qF -- "$1" "$tmp/out.txt"; then fail "stdout has: $1"; fi; }
fail_showing_output() {
  echo "FAIL: $*" >&2
  echo "--- stdout ---" >&2; cat "$tmp/out.txt" >&2 || true
  echo "--- stderr ---" >&2; cat "$tmp/err.txt" >&2 || true
  exit 1
}

# venv DIR SPEC...: a cached virtual environment (Debian's python3, --system-site-packages for
# its torch, numpy, h5py and sentencepiece) with the pip requirements SPEC from PyPI; a stamp
# file records them, so that a changed list makes a new one. The items of SPEC after a
# "--no-deps" are installed after the others, without their dependencies. A list that names no
# torch keeps Debian's: a venv into which pip brought one is refused. Pinned versions: a new
# transformers release must not change what a test means without an edit here. hf_tf5_spec: the
# one transformers 5 list, shared by the tests that use it (test_export_transformers,
# test_tokenizer_json: the `tokenizers` it brings; test_chat_data: jinja2, which transformers'
# apply_chat_template renders with), so they share one $build/hf_venv_tf5.
hf_tf5_spec=("transformers==5.23.0" "protobuf==7.36.2" "jinja2==3.1.6")
# hf_tf4_spec: transformers 4 on Debian's torch 1.13 (test_archs, test_generate,
# test_export_transformers, test_sft_recipes). hf_peft_spec: PEFT on that list (test_lora_peft),
# in a venv of its own ($build/hf_venv_peft, about 170 MB) so that hf_tf4_spec's tests keep
# their environment. peft 0.13.2 (October 2024, as transformers 4.46) states torch>=1.13.0,
# which Debian's 1.13.0a0 does not meet, so pip would bring torch 2 (5.3 GB): it is installed
# without its dependencies, and runs on 1.13; accelerate 0.34.2 (torch>=1.10) and jinja2 (PEFT's
# save_pretrained writes a model card with it) come with theirs. hf_torch2_spec: torch 2 from
# PyPI with the transformers 5 list (test_qwen3_transformers: about 2.8 GB to download), and
# PEFT for test_lora_peft's qwen3 (Qwen3ForCausalLM needs transformers >= 4.51, so torch 2):
# peft 0.21.2 and the accelerate it needs, which leave every other package as it was; and TRL
# 1.16.0 for test_dpo_trl (DPOTrainer's loss as the reference), without its dependencies: it
# states numpy>=1.26, and a numpy 2 in the venv breaks Debian's h5py (built for its numpy 1.24,
# which the torch 2 tests import), as the newest pandas and pyarrow would too; datasets, pandas
# and pyarrow pinned to releases that run on numpy 1.24 (about 70 MB), and TRL runs on it.
# tensorboard_spec: TensorBoard's own reader of event files (test_tensorboard), in a venv of its
# own ($build/tensorboard_venv, about 40 MB): tensorboard without its server's dependencies
# (grpcio, werkzeug, the data server: only its Python reader runs), with the protobuf it parses
# Events with and absl-py, which its TensorFlow stand-in imports.
# tests/cli/make_venvs.sh makes all five ahead of the suite (scripts/test.sh, during the Release
# build).
hf_tf4_spec=("transformers==4.46.3")
hf_peft_spec=("${hf_tf4_spec[@]}" "accelerate==0.34.2" "jinja2==3.1.6" --no-deps "peft==0.13.2")
hf_torch2_spec=("torch==2.15.0" "${hf_tf5_spec[@]}" "peft==0.21.2" "accelerate==1.15.0"
                "datasets==4.7.0" "pandas==2.2.3" "pyarrow==21.0.0" --no-deps "trl==1.16.0")
tensorboard_spec=("protobuf==7.36.2" "absl-py==2.5.1" --no-deps "tensorboard==2.21.0")
# Tests sharing a venv may run at once (ctest -j): a lock file beside it lets one make it while
# the others wait. FT_TEST_VENVS=FOLDER: the venv is made there and DIR links to it, so that two
# build folders share one download (scripts/test.sh: the sanitizer pass uses the Release pass's).
venv() {
  local dir="$1" lock_fd; shift
  if [[ -n ${FT_TEST_VENVS:-} ]]; then
    mkdir -p "$FT_TEST_VENVS"
    [[ -e $dir || -L $dir ]] || ln -s "$FT_TEST_VENVS/${dir##*/}" "$dir" 2>/dev/null || true
    [[ -L $dir ]] && dir=$(readlink "$dir")
  fi
  exec {lock_fd}> "$dir.lock"
  flock "$lock_fd"
  if [[ ! -x "$dir/bin/python" || "$(cat "$dir/ft_requirements" 2>/dev/null)" != "$*" ]]; then
    rm -rf "$dir"
    echo "making $dir ($* from PyPI)"
    /usr/bin/python3 -m venv --system-site-packages "$dir"
    local spec=("$@") nodeps=() i
    for i in "${!spec[@]}"; do
      if [[ ${spec[$i]} == --no-deps ]]; then
        nodeps=("${spec[@]:$((i + 1))}")
        spec=("${spec[@]:0:$i}")
        break
      fi
    done
    "$dir/bin/pip" install -q --disable-pip-version-check "${spec[@]}" ||
      { echo "FAIL: pip install ${spec[*]} failed (is PyPI reachable?)" >&2; exit 1; }
    if ((${#nodeps[@]})); then
      "$dir/bin/pip" install -q --disable-pip-version-check --no-deps "${nodeps[@]}" ||
        { echo "FAIL: pip install --no-deps ${nodeps[*]} failed (is PyPI reachable?)" >&2; exit 1; }
    fi
    # Debian's torch is in dist-packages; one that pip installed, in the venv's site-packages.
    if [[ " $* " != *" torch=="* && $("$dir/bin/python" -c 'import importlib.util as u
s = u.find_spec("torch"); print(s.origin if s else "")') == */site-packages/* ]]; then
      echo "FAIL: pip install $* brought a torch into $dir, where Debian's was meant (a" \
        "requirement above 1.13.0a0: install that package after --no-deps)" >&2
      exit 1
    fi
    echo "$*" > "$dir/ft_requirements"
  fi
  flock -u "$lock_fd"
  exec {lock_fd}>&-
}
