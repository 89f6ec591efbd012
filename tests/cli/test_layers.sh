#!/usr/bin/env bash
# The layering of DESIGN.md §1 (scripts/check_layers.py): the source tree passes, and the check
# fails on what it is there to catch, naming file and line:
#  - the tree as it is: exit 0;
#  - a copy of lib/ with an upward include (model including train/), a test include (runtime
#    including tests/), a kernel lab's include (kernels including dev/), an upward include
#    through the "lib/" spelling (kernels including lib/runtime/) and a folder that is no layer:
#    exit 1, one line each, with file:line;
#  - a CMakeLists.txt whose ft_layer() links a library that is not below it (optim → train);
#  - a library file of 901 lines (the limit is 900: one of 900, and a kernel of 901, pass);
#  - an include of the same or a lower layer, or a link downward, is not reported.
#   bash tests/cli/test_layers.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
check="$src/scripts/check_layers.py"

run_rc 0 /usr/bin/python3 "$check" "$src"
has_out "every include goes down"

mkdir -p "$tmp/tree/lib/core" "$tmp/tree/lib/model" "$tmp/tree/lib/runtime" "$tmp/tree/lib/train" \
  "$tmp/tree/lib/extras" "$tmp/tree/kernels/cpu" "$tmp/tree/kernels/cuda" "$tmp/tree/apps/ft"
cat > "$tmp/tree/lib/model/llama.cpp" <<'CPP'
#include "model/llama.h"
#include "core/error.h"
#include "runtime/device.h"

#include "train/trainer.h"
CPP
cat > "$tmp/tree/lib/runtime/ops.cpp" <<'CPP'
// #include "train/trainer.h" in a comment is not an include
#include "tests/cuda_emu/cuda_emu.h"
CPP
cat > "$tmp/tree/kernels/cpu/gemm.cpp" <<'CPP'
#include "core/half.h"
#include "lib/runtime/device.h"
CPP
cat > "$tmp/tree/kernels/cuda/attention_fused.cu" <<'CPP'
#include "kernels/cuda/attention_fused.cuh"
#include "dev/attention/fused_variants.cu"
CPP
echo '#include "core/error.h"' > "$tmp/tree/lib/extras/thing.cpp"
echo '#include "train/trainer.h"' > "$tmp/tree/apps/ft/main.cpp"
seq 901 | sed 's|^|// |' > "$tmp/tree/lib/core/big.cpp"
seq 900 | sed 's|^|// |' > "$tmp/tree/lib/core/fits.cpp"
seq 901 | sed 's|^|// |' > "$tmp/tree/kernels/cpu/long_kernel.cpp"
printf 'ft_layer(core Threads::Threads)\nft_layer(model ft_parallel)\nft_layer(optim ft_train)\n' \
  > "$tmp/tree/CMakeLists.txt"

run_rc 1 /usr/bin/python3 "$check" "$tmp/tree"
has_out "lib/model/llama.cpp:5: layer 'model' includes train/trainer.h of layer 'train'"
has_out "lib/runtime/ops.cpp:2: includes test code tests/cuda_emu/cuda_emu.h"
has_out "kernels/cpu/gemm.cpp:2: layer 'kernels' includes lib/runtime/device.h of layer 'runtime'"
has_out "kernels/cuda/attention_fused.cu:2: includes the kernel labs' code dev/attention/fused_variants.cu"
has_out "lib/extras/thing.cpp: folder lib/extras is not a layer"
has_out "CMakeLists.txt:3: ft_optim links ft_train, which is not below it"
has_out "lib/core/big.cpp: 901 lines, over the 900 a library file may have"
[[ $(wc -l < "$tmp/out.txt") == 7 ]] || fail_showing_output "expected exactly 7 problems"
has_err "7 problem(s) against the layering"
echo "test_layers: all checks passed"
