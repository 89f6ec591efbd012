#!/usr/bin/env bash
# The layout subset (every axis, every ZeRO stage, a 3-D layout) with ranks talking over TCP
# only (`--mca btl tcp,self`, standing in for separate nodes), against the one-process run.
#   bash tests/cli/test_layouts_tcp.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
exec bash "$2/scripts/test_layouts.sh" --ci --tcp "$1"
