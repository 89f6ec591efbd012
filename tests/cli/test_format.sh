#!/usr/bin/env bash
# The formatting of DESIGN.md §1 (.clang-format: Google-based, 100 columns) stays: the tree
# passes scripts/check_format.sh, and a file formatted otherwise fails it by name. Skipped where
# clang-format 14 is not installed (the check's exit 77).
#   bash tests/cli/test_format.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
rc=0
bash "$src/scripts/check_format.sh" "$src" > "$tmp/out.txt" 2> "$tmp/err.txt" || rc=$?
if [[ $rc == 77 ]]; then
  cat "$tmp/out.txt"
  exit 0
fi
[[ $rc == 0 ]] || fail_showing_output "the tree is not formatted"
# A scratch repository with the same .clang-format, one file formatted otherwise and one as it
# writes it.
mkdir -p "$tmp/tree/lib/core"
cp "$src/.clang-format" "$tmp/tree/"
printf 'int  f( int x ){return x;}\n' > "$tmp/tree/lib/core/bad.cpp"
printf 'int f(int x) { return x; }\n' > "$tmp/tree/lib/core/good.cpp"
git -C "$tmp/tree" init -q && git -C "$tmp/tree" add -A
run_rc 1 bash "$src/scripts/check_format.sh" "$tmp/tree"
has_out "lib/core/bad.cpp"
lacks_out "lib/core/good.cpp"
has_err "1 file(s) differ"
echo "test_format: all checks passed"
