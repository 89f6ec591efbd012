#!/usr/bin/env bash
# The central parallelism test (DESIGN.md §3): the whole layout matrix of
# scripts/test_layouts.sh — data 2 and 4, tensor 2, pipeline 2 and 3 (uneven), and the 2-D and
# 3-D combinations, under every ZeRO stage where data > 1 — against the one-process run.
# About 12 s on 2 cores, so CI runs all of it.
#   bash tests/cli/test_layouts.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
exec bash "$2/scripts/test_layouts.sh" "$1"
