#!/usr/bin/env bash
# Makes a virtual environment with PyTorch 2.x from PyPI for scripts/bench.sh --torch-python: a
# user's real alternative to ft (Debian's torch 1.13 stays the CI reference; it is much slower
# on CPUs newer than it knows). PyPI's default Linux wheel is the CUDA build and pulls several GB
# of nvidia-* packages; its CPU path works once they are installed.
#   scripts/bench_torch_venv.sh [DIR]     (default: ~/.cache/ft/torch_venv)
# Prints the interpreter to pass: scripts/bench.sh --torch-python DIR/bin/python
set -euo pipefail
dir=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/ft/torch_venv}
if [[ ! -x $dir/bin/python ]]; then
  # Debian's python3 ships venv only with python3-venv (scripts/setup.sh installs it).
  /usr/bin/python3 -m venv "$dir" || {
    echo "bench_torch_venv.sh: could not make a venv in $dir; try: apt-get install python3-venv" >&2
    exit 1
  }
fi
"$dir/bin/python" -m pip install --quiet --upgrade pip
# numpy and h5py: bench.py imports tests/ref/llama_ref.py, which needs them.
"$dir/bin/python" -m pip install --quiet 'torch>=2' numpy h5py
"$dir/bin/python" -c 'import torch; print("torch", torch.__version__, "in", torch.__file__)' >&2
echo "$dir/bin/python"
