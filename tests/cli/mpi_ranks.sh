# Sourced by the multi-rank CLI tests (not a test itself: ctest runs tests/cli/test_*.sh).
#
# rank_pid PATTERN RANK: the pid of the process whose command line contains PATTERN and whose
# environment says it is MPI rank RANK (OMPI_COMM_WORLD_RANK); empty if there is none (yet).
# Never fails: tests poll it under `set -e -o pipefail`.
rank_pid() {
  local p
  for p in $(pgrep -f -- "$1" || true); do
    if grep -qx "OMPI_COMM_WORLD_RANK=$2" < <(tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null); then
      echo "$p"
      return 0
    fi
  done
  return 0
}
