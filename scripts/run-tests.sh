#!/bin/sh
# usage: run-tests.sh BUILD_DIR TEST_BINARY...  Runs the test binaries KILN_TEST_JOBS at a time
# (default: one per CPU), each with a log and a kernel cache of its own; says how each ended as
# it ends, then prints the logs of the failed ones in full and a summary. Fails if any failed.
# The longest programs should come first in the list: they start first.
build="$1"; shift
export KILN_BIN="${KILN_BIN:-$build/kiln}"
export KILN_SRC="${KILN_SRC:-$(pwd)}"
# Check's per-test timeouts catch hangs; they are not speed checks. Stretched so that a loaded
# machine or a sanitizer build never trips them (Check reads both variables).
export CK_DEFAULT_TIMEOUT="${CK_DEFAULT_TIMEOUT:-600}"
export CK_TIMEOUT_MULTIPLIER="${CK_TIMEOUT_MULTIPLIER:-4}"
jobs="${KILN_TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}"
logs=$(mktemp -d "${TMPDIR:-/tmp}/kiln-tests-XXXXXX")
trap 'rm -rf "$logs"' EXIT INT TERM
echo "running $# test programs, $jobs at a time"
# One shell per test: its log, its exit status, and one line when it ends ("ok  NAME  3.1 s").
printf '%s\n' "$@" | xargs -P "$jobs" -I{} sh -c '
    t="$1"; n=$(basename "$t"); s=$(date +%s.%N)
    KILN_CACHE_DIR="$0/cache-$n" "$t" > "$0/$n.log" 2>&1; rc=$?
    echo "$rc" > "$0/$n.rc"
    secs=$(awk -v s="$s" -v e="$(date +%s.%N)" "BEGIN { printf \"%.1f\", e - s }")
    summary=$(grep -E "^[0-9]+%: Checks" "$0/$n.log" | tail -n 1)
    if [ "$rc" -eq 0 ]; then echo "ok    $n  ${secs} s  $summary"; else echo "FAIL  $n  ${secs} s  (exit $rc)  $summary"; fi
' "$logs" {}
fail=0; failed=""
for t in "$@"; do
    n=$(basename "$t")
    if [ "$(cat "$logs/$n.rc" 2>/dev/null)" != 0 ]; then
        fail=$((fail + 1)); failed="$failed $t"
        echo "== $t (failed): its log"
        cat "$logs/$n.log" 2>/dev/null
    fi
done
if [ "$fail" -ne 0 ]; then
    echo "FAILED: $fail test program(s):$failed"
    exit 1
fi
echo "all $# test programs passed"
