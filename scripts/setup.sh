#!/usr/bin/env bash
# Sets up ft on a fresh Debian 12 machine: installs the Debian packages the build and tests need,
# configures and builds a Release build/ft, and prepares the quickstart data (a generated corpus,
# a SentencePiece model trained on it, and token shards). Safe to run again: it skips what is done.
#   scripts/setup.sh            # packages + build + quickstart data
#   scripts/setup.sh --no-data  # packages + build only
#   scripts/setup.sh --packages # packages only (scripts/test.sh times them apart from the build)
# Environment: BUILD_DIR (default build), FT_CMAKE_ARGS (extra cmake arguments).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

with_data=1 with_build=1
[[ "${1:-}" == "--no-data" ]] && with_data=0
[[ "${1:-}" == "--packages" ]] && with_data=0 with_build=0

packages=(
  build-essential cmake pkg-config git procps time
  libcli11-dev libyaml-cpp-dev nlohmann-json3-dev doctest-dev
  libsentencepiece-dev sentencepiece
  libpcre2-dev libicu-dev  # byte-level BPE tokenizer.json: regexes, NFC
  libhdf5-dev zlib1g-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev libdnnl-dev
  python3 python3-torch python3-numpy python3-h5py python3-sentencepiece
  python3-venv  # tests/cli/test_export_transformers.sh: transformers from PyPI in a venv
  patchelf xz-utils  # scripts/bundle.sh: RPATH $ORIGIN/lib and the .tar.xz
  libcairo2     # ft plot --output X.png (opened at run time; ft does not link it)
  librsvg2-bin  # tests/cli/test_plot.sh: rsvg-convert renders ft plot's SVG
)
source scripts/install_missing.sh
install_missing setup "${packages[@]}"
((with_build)) || exit 0

build_dir="${BUILD_DIR:-build}"
echo "setup: building $build_dir (Release)"
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ${FT_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j"$(nproc)"

if ((with_data)); then
  scripts/quickstart_data.sh "$build_dir"
fi
echo "setup: done. Next: $build_dir/ft train recipes/quickstart.yaml"
