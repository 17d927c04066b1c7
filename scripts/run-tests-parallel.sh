#!/bin/sh
# usage: run-tests-parallel.sh BUILD_DIR TEST_BINARY...  Runs the test binaries at the same time
# (the GPU tests: one GPU, but most of their time is NVRTC on the CPU), each with a kernel cache
# and a log of its own, then prints every log in order and a summary; fails if any failed.
build="$1"; shift
export KILN_BIN="${KILN_BIN:-$build/kiln}"
export KILN_SRC="${KILN_SRC:-$(pwd)}"
logs=$(mktemp -d "${TMPDIR:-/tmp}/kiln-tests-XXXXXX")
for t in "$@"; do
    n=$(basename "$t")
    ( KILN_CACHE_DIR="$logs/cache-$n" "$t" > "$logs/$n.log" 2>&1; echo $? > "$logs/$n.rc" ) &
done
wait
fail=0; failed=""
for t in "$@"; do
    n=$(basename "$t")
    echo "== $t"
    cat "$logs/$n.log"
    if [ "$(cat "$logs/$n.rc")" != 0 ]; then fail=$((fail + 1)); failed="$failed $t"; fi
done
rm -rf "$logs"
if [ "$fail" -ne 0 ]; then
    echo "FAILED: $fail test program(s):$failed"
    exit 1
fi
echo "all $# test programs passed"
