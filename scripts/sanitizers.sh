# Sourced by scripts/test.sh and scripts/fuzz.sh (not run on its own): the sanitizer build,
# build-asan/. clang 19 (Debian 12's clang-19) with AddressSanitizer and UndefinedBehaviorSanitizer
# (FT_SANITIZE) and the libFuzzer harnesses (FT_FUZZ), at -O1 with line tables, without nvcc's
# device code. One build serves both the sanitizer suite (`ctest -L sanitize`) and the fuzzing;
# until 0180f21 they were two (gcc's sanitizers, clang 14's libFuzzer), 1003 s of CI's 2587
# on a 2-core AVX2 host. clang 14 cannot compile the tests (C++20: std::source_location, lambda
# captures of structured bindings).
#   sanitize_build TARGET...   installs clang 19 if missing, configures build-asan/, builds TARGETs
#   sanitize_env               exports what the tests and harnesses run with: the leak
#                              suppressions and the symbolizer
# FT_CMAKE_ARGS: extra cmake arguments (a compiler launcher while working; CI has none).
sanitize_dir=build-asan

sanitize_build() {
  source scripts/install_missing.sh
  # llvm-19 for llvm-symbolizer, which puts file:line into the reports
  install_missing sanitizers clang-19 libclang-rt-19-dev libomp-19-dev llvm-19
  # -O1: what AddressSanitizer's documentation recommends (libFuzzer's builds its examples so
  # too), and a third less compile time than -O2 under the sanitizers; the CPU kernels' -O3 is
  # the Release build's only. -g1: line tables, which is what a report's stack trace prints
  # (file:line, inlined frames too); full -g costs about a fifth more compile time and nothing a
  # report uses. FT_CUDA=OFF: nvcc's device code has no sanitizer, and the Release build has
  # compiled it (the spill check); the CUDA backend's host code is built on the emulation here.
  # A folder keeps the compilers it was first configured with: a build-asan/ from before this
  # build moved to clang (gcc's) starts afresh.
  if [[ -f $sanitize_dir/CMakeCache.txt ]] &&
     ! grep -Eq '^CMAKE_CXX_COMPILER:[A-Z]+=.*clang\+\+-19$' "$sanitize_dir/CMakeCache.txt"; then
    echo "sanitizers: $sanitize_dir/ was configured with another compiler; configuring it afresh"
    rm -rf "$sanitize_dir"
  fi
  # shellcheck disable=SC2086
  CC=clang-19 CXX=clang++-19 cmake -S . -B "$sanitize_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFT_SANITIZE=ON -DFT_FUZZ=ON -DFT_CUDA=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" ${FT_CMAKE_ARGS:-} >/dev/null
  cmake --build "$sanitize_dir" -j"$(nproc)" --target "$@"
}

sanitize_env() {
  # Leak checking stays on, less the suppressions of lsan.supp (not ours).
  export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp"
  export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-19/bin/llvm-symbolizer
}
