#!/usr/bin/env bash
# Damaged shards give a clear error naming the file, never a crash or a hang
# (lib/data/shard_check.cpp says how). The two saved inputs come from mutating small h5py shards:
#   crash_vlen_attr.h5   14 bytes changed; libhdf5 1.10 segfaults in H5HG_read while reading a
#                        variable-length string attribute
#   spin_global_heap.h5  14 bytes changed; libhdf5 loops forever in H5HG__protect (same read)
# Each must make `ft inspect`, `ft train` and `ft train --nproc 2` exit 1 within a time bound
# with the file's name in the message; a folder of good h5py shards of every storage kind must
# still read.
#   bash tests/cli/test_damaged_shards.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
damaged="$src/tests/data/damaged_shards"
mpi_env
# A 2 s limit per shard instead of the default 5 s, so the spinning input costs 2 s per run.
export FT_SHARD_CHECK_TIMEOUT_S=2

# expect_error NAME MAX_SECONDS PATTERN CMD...: CMD exits 1 within MAX_SECONDS, PATTERN on stderr.
expect_error() {
  local name="$1" max_s="$2" pattern="$3"; shift 3
  local t0=$SECONDS rc=0
  timeout 120 "$@" >"$tmp/out.txt" 2>"$tmp/err.txt" || rc=$?
  local took=$((SECONDS - t0))
  [[ $rc -eq 1 ]] || { cat "$tmp/err.txt" >&2; fail "$name: exit $rc, want 1"; }
  grep -qF -- "$pattern" "$tmp/err.txt" ||
    { cat "$tmp/err.txt" >&2; fail "$name: stderr lacks '$pattern'"; }
  [[ $took -le $max_s ]] || fail "$name: took ${took}s, limit ${max_s}s"
  echo "ok: $name (${took}s)"
}

# Good shards beside the damaged one, so the error must name the right file.
/usr/bin/python3 - "$tmp" <<'PY'
import sys, h5py, numpy as np
t = sys.argv[1]
def shard(path, **kw):
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "ft-tokens"; f.attrs["version"] = 1; f.attrs["vocab_size"] = 300
        f.attrs["bos_id"] = 1; f.attrs["eos_id"] = 2; f.attrs["tokenizer_sha256"] = "ab" * 32
        tok = (np.arange(400) * 7 % 300).astype(kw.pop("dtype", "<u2"))
        f.create_dataset("tokens", data=tok, **kw)
        f.create_dataset("doc_offsets", data=np.array([0, 150], dtype=np.uint64))
import os
for d in ("crash", "spin", "good"):
    os.makedirs(f"{t}/{d}")
    shard(f"{t}/{d}/a_contiguous.h5")
    shard(f"{t}/{d}/b_chunked.h5", chunks=(64,))
    shard(f"{t}/{d}/c_gzip.h5", chunks=(100,), compression="gzip", shuffle=True)
    shard(f"{t}/{d}/d_big_endian.h5", dtype=">u2")
PY
cp "$damaged/crash_vlen_attr.h5" "$tmp/crash/b_damaged.h5"
cp "$damaged/spin_global_heap.h5" "$tmp/spin/b_damaged.h5"

# Every storage kind reads back the same tokens (the loader path is covered by ft train below).
"$ft" inspect "$tmp/good" > "$tmp/inspect.txt" || fail "inspect of good h5py shards failed"
grep -Eq '^ +tokens: +1600$' "$tmp/inspect.txt" || { cat "$tmp/inspect.txt"; fail "token count"; }
echo "ok: contiguous, chunked, gzip and big-endian h5py shards inspect"

expect_error "inspect: libhdf5 crash" 10 \
  "$tmp/crash/b_damaged.h5: damaged: reading it crashed libhdf5 (SIG" "$ft" inspect "$tmp/crash"
expect_error "inspect: libhdf5 spin" 10 \
  "$tmp/spin/b_damaged.h5: damaged: reading it with libhdf5 did not finish in 2 s" \
  "$ft" inspect "$tmp/spin"

recipe() {
  cat > "$tmp/r_$1.yaml" <<YAML
run: {name: t, output_dir: $tmp/out_$1, seed: 3}
model: {dim: 16, n_layers: 1, n_heads: 2, n_kv_heads: 2, ffn_dim: 32, vocab_size: 300,
        max_seq_len: 16}
data: {train: $tmp/$1, seq_len: 16, shuffle: false}
training: {steps: 4, micro_batch_size: 1, global_batch_size: 2}
optimizer: {lr: 0.01}
runtime: {threads: 1}
YAML
}
for d in good crash spin; do recipe "$d"; done
"$ft" train "$tmp/r_good.yaml" --nproc 2 > "$tmp/good.txt" 2>&1 \
  || { cat "$tmp/good.txt"; fail "ft train --nproc 2 on good h5py shards failed"; }
grep -q '^ft: done: 4 steps' "$tmp/good.txt" || { cat "$tmp/good.txt"; fail "no summary"; }
echo "ok: train --nproc 2 on every storage kind (each rank spawns its shard check)"

expect_error "train: libhdf5 crash" 20 \
  "$tmp/crash/b_damaged.h5: damaged: reading it crashed libhdf5" \
  "$ft" train "$tmp/r_crash.yaml"
expect_error "train: libhdf5 spin" 20 \
  "$tmp/spin/b_damaged.h5: damaged: reading it with libhdf5 did not finish in 2 s" \
  "$ft" train "$tmp/r_spin.yaml"
expect_error "train --nproc 2: libhdf5 crash" 30 "$tmp/crash/b_damaged.h5: damaged" \
  "$ft" train "$tmp/r_crash.yaml" --nproc 2
echo "PASS test_damaged_shards"
