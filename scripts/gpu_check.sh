#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, from the archive scripts/bundle.sh makes here.
#   bash scripts/gpu_check.sh [ft-bundle.tar.xz] [gpu_check.py options: --only NAME,... --skip ...]
# Unpacks the archive (python3 -m tarfile: the GPU image may lack xz), runs scripts/gpu_check.py
# (kernel tests natively, every op against the CPU, compute-sanitizer memcheck and racecheck,
# 50 steps GPU against CPU in fp32 and bf16, determinism, the ~1B benchmark against PyTorch) and
# prints one summary. Logs and summary.txt go to $OUT (the device tool's output folder) or
# ./gpu_check_out.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
archive=ft-bundle.tar.xz
if [[ $# -gt 0 && $1 != --* ]]; then archive=$1; shift; fi
if [[ ! -f $archive ]]; then
  echo "gpu_check.sh: no bundle at $archive (make one with scripts/bundle.sh)" >&2
  exit 2
fi
out=${OUT:-$PWD/gpu_check_out}
mkdir -p "$out"
work=$(mktemp -d /tmp/ft_gpu_check.XXXXXX)
python3 -m tarfile -e "$archive" "$work"
bundle=$(find "$work" -maxdepth 2 -name ft -type f -perm -u+x -printf '%h\n' | head -1)
[[ -n $bundle ]] || { echo "gpu_check.sh: $archive holds no ft executable" >&2; exit 2; }
exec python3 scripts/gpu_check.py --bundle "$bundle" --out "$out" "$@"
