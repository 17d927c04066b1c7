#!/bin/sh
# usage: run-tests.sh BUILD_DIR TEST_BINARY...  Runs each test binary, prints a summary, and
# fails if any failed.
build="$1"; shift
export KILN_BIN="${KILN_BIN:-$build/kiln}"
export KILN_SRC="${KILN_SRC:-$(pwd)}"
fail=0; failed=""
for t in "$@"; do
    echo "== $t"
    if ! "$t"; then fail=$((fail + 1)); failed="$failed $t"; fi
done
if [ "$fail" -ne 0 ]; then
    echo "FAILED: $fail test program(s):$failed"
    exit 1
fi
echo "all $# test programs passed"
