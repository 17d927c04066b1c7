#!/bin/sh
# usage: run-tests-parallel.sh BUILD_DIR TEST_BINARY...  run-tests.sh with every program at the
# same time (the GPU tests: one GPU, but most of their time is NVRTC on the CPU).
KILN_TEST_JOBS="${KILN_TEST_JOBS:-$(($# - 1))}" exec "$(dirname "$0")/run-tests.sh" "$@"
