#!/usr/bin/env bash
# Fetches the wheels that scripts/gpu_bench_torch.py --lora needs on the GPU image, which has
# PyTorch and transformers but no PEFT and no network (gpu_check.py's lora_8b stage; carry the
# folder with the device tool's `carry`). Pinned, hash-checked, without dependencies:
#   peft 0.21.2 and 0.13.2  the bench imports the newest that runs on the image's transformers
#                           (both import and train on transformers 5.23; 0.13.2 is the October
#                           2024 release, as transformers 4.46, for an older image)
#   accelerate 1.15.0       PEFT imports it; Python >= 3.10, torch >= 2.0
#   psutil 7.2.2            PEFT and accelerate import it (abi3: any CPython >= 3.6, x86-64)
# Assumed on the image, since its transformers needs them too: numpy, packaging, pyyaml, tqdm,
# safetensors, huggingface_hub (peft 0.21.2 wants >= 0.25, 0.13.2 >= 0.17). About 1.7 MB.
#   bash scripts/peft_wheels.sh [DIR]     # default build/wheels
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=${1:-build/wheels}
mkdir -p "$dir"
req=$(mktemp); trap 'rm -f "$req" "$req.one"' EXIT
cat > "$req" <<'REQ'
peft==0.21.2 --hash=sha256:106ab6077ff72c54d21577f9af5970e34bac7582cb14209f7b2b511e322a4eae
peft==0.13.2 --hash=sha256:d4e0951ec78eac11c45a051801c569913436888c578d48e5ce86996b715bc6ef
accelerate==1.15.0 --hash=sha256:97eacca0b73e45cb867dbf8c5d5d4dc32219544300e0c8992c7334dc2ef33cec
psutil==7.2.2 --hash=sha256:076a2d2f923fd4821644f5ba89f059523da90dc9014e85f8e45a5774ca5bc6f9
REQ
# pip resolves each name once: the two PEFT pins are fetched one at a time.
for pin in "peft==0.21.2" "peft==0.13.2" "accelerate==1.15.0" "psutil==7.2.2"; do
  grep "^$pin " "$req" > "$req.one"
  python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
    --platform manylinux2014_x86_64 -d "$dir" -r "$req.one"
done
rm -f "$req.one"
ls -l "$dir"/*.whl
echo "peft_wheels: $(du -sh "$dir" | cut -f1) in $dir"
