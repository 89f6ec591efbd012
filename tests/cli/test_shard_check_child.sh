#!/usr/bin/env bash
# The shard check's child process (lib/data/shard_check.cpp) never outlives its use. Each case
# runs ft on a folder whose one shard makes libhdf5 loop forever (tests/data/damaged_shards/
# spin_global_heap.h5), finds the child (the process whose parent is ft and whose arguments are
# `__ft_shard_check__ PID FILE`) and waits until it has spent 0.3 s of CPU time, so it is in
# libhdf5's loop (a good shard's metadata takes milliseconds). Then:
#  - `ft inspect`, and `ft train`, killed with SIGKILL while the child spins with a 600 s time
#    limit: the child is gone within 5 s (it dies with its parent: PR_SET_PDEATHSIG).
#  - `ft inspect` stopped with SIGSTOP, limit 2 s: nothing watches the child's wall clock, yet
#    it ends within 30 s (its CPU-time limit, 3 to 4 s) while ft is still stopped; ft,
#    continued, exits 1 naming the file: "used more than 2 s of CPU time".
#  - The default limit (no FT_SHARD_CHECK_TIMEOUT_S): 5 s plus 1 s per 50 MiB (DESIGN.md §6), so
#    `ft inspect` exits 1 with "did not finish in 5 s" within 15 s.
# "Gone" means no such process or a zombie (a dead process its parent has not yet reaped).
#   bash tests/cli/test_shard_check_child.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
# At exit, kill whatever this test started and any check child of it (found by this test's
# folder in its arguments): a failed check must not leave a spinning child behind.
pids=()
cleanup() {
  local p
  for p in "${pids[@]}" $(pgrep -f "__ft_shard_check__ .*$tmp/" || true); do
    kill -CONT "$p" 2> /dev/null || true
    kill -KILL "$p" 2> /dev/null || true
  done
  remove_tmp
}
trap cleanup EXIT
mkdir "$tmp/spin"
cp "$src/tests/data/damaged_shards/spin_global_heap.h5" "$tmp/spin/b_damaged.h5"
clk_tck=$(getconf CLK_TCK)

gone() {  # gone PID: no such process, or a zombie
  local state
  state=$(ps -o stat= -p "$1" 2> /dev/null) || return 0
  [[ $state == Z* ]]
}
cpu_ticks() {  # cpu_ticks PID: user + system CPU time in clock ticks (fields 14, 15 of stat)
  awk '{print $14 + $15}' "/proc/$1/stat" 2> /dev/null || echo 0
}
# spinning_child FT_PID: the pid of FT_PID's check child once it has spent 0.3 s of CPU time.
spinning_child() {
  local parent=$1 child="" i
  for ((i = 0; i < 600; ++i)); do  # 30 s
    [[ -n $child ]] || child=$(pgrep -P "$parent" -f __ft_shard_check__ | head -n 1) || true
    if [[ -n $child ]]; then
      if (($(cpu_ticks "$child") * 10 >= 3 * clk_tck)); then
        echo "$child"
        return 0
      fi
    fi
    sleep 0.05
  done
  fail "no spinning shard check child of ft (pid $parent) within 30 s (child: ${child:-none})"
}
# wait_gone PID SECONDS WHAT: fails unless PID is gone within SECONDS.
wait_gone() {
  local i
  for ((i = 0; i < $2 * 20; ++i)); do
    gone "$1" && return 0
    sleep 0.05
  done
  fail "$3: the shard check child (pid $1, $(ps -o stat=,args= -p "$1")) is still there after $2 s"
}

cat > "$tmp/r.yaml" <<YAML
run: {name: t, output_dir: $tmp/out, seed: 3}
model: {dim: 16, n_layers: 1, n_heads: 2, n_kv_heads: 2, ffn_dim: 32, vocab_size: 300,
        max_seq_len: 16}
data: {train: $tmp/spin, seq_len: 16, shuffle: false}
training: {steps: 4, micro_batch_size: 1, global_batch_size: 2}
optimizer: {lr: 0.01}
runtime: {threads: 1}
YAML

# SIGKILL of ft while its child spins.
for cmd in inspect train; do
  if [[ $cmd == inspect ]]; then args=(inspect "$tmp/spin"); else args=(train "$tmp/r.yaml"); fi
  FT_SHARD_CHECK_TIMEOUT_S=600 "$ft" "${args[@]}" > "$tmp/$cmd.out" 2>&1 &
  ft_pid=$!
  pids+=("$ft_pid")
  child=$(spinning_child "$ft_pid")
  kill -KILL "$ft_pid"
  wait "$ft_pid" 2> /dev/null || true
  wait_gone "$child" 5 "ft $cmd killed"
  echo "ok: ft $cmd killed with SIGKILL: its shard check child is gone"
done

# SIGSTOP of ft: the child's CPU-time limit ends it.
FT_SHARD_CHECK_TIMEOUT_S=2 "$ft" inspect "$tmp/spin" > "$tmp/out.txt" 2> "$tmp/err.txt" &
ft_pid=$!
pids+=("$ft_pid")
child=$(spinning_child "$ft_pid")
kill -STOP "$ft_pid"
wait_gone "$child" 30 "ft stopped, limit 2 s"
[[ $(ps -o stat= -p "$ft_pid") == T* ]] || fail "ft (pid $ft_pid) is no longer stopped"
kill -CONT "$ft_pid"
rc=0
wait "$ft_pid" || rc=$?
[[ $rc == 1 ]] || fail_showing_output "ft inspect, stopped and continued: exit $rc, want 1"
has_err "$tmp/spin/b_damaged.h5: damaged: reading it with libhdf5 used more than 2 s of CPU time"
echo "ok: ft stopped: the child ends at its CPU-time limit; ft names the file"

# The default limit.
t0=$SECONDS
run_rc 1 env -u FT_SHARD_CHECK_TIMEOUT_S "$ft" inspect "$tmp/spin"
has_err "$tmp/spin/b_damaged.h5: damaged: reading it with libhdf5 did not finish in 5 s"
took=$((SECONDS - t0))
((took <= 15)) || fail "the default limit: ft inspect took ${took}s, limit 15 s"
echo "ok: the default limit is 5 s (${took}s)"
echo "PASS test_shard_check_child"
