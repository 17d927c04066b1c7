#!/bin/sh
# usage: scripts/fuzz.sh BUILD_DIR TARGET...   (make fuzz runs it; docs/fuzzing.md)
# Runs each libFuzzer target BUILD_DIR/fuzz/TARGET for FUZZ_SECONDS (default 60) on a scratch
# copy of its corpus (tests/fuzz/corpus/TARGET plus fresh seeds from BUILD_DIR/fuzz/fuzz_seeds),
# so a run never grows the committed corpus. Crash, leak and timeout inputs are saved in
# BUILD_DIR/fuzz-out/TARGET/ (artifacts), each run's log in BUILD_DIR/fuzz-out/TARGET.log.
# Ends with a table (target, executions, exec/s, result) and fails if any target found
# anything.
#   FUZZ_SECONDS=N  seconds per target
#   FUZZ_JOBS=N     N fuzzing processes per target (libFuzzer -fork=N), for long campaigns on
#                   many cores; 1 (default): one process
#   FUZZ_KEEP=1     keep each scratch corpus (BUILD_DIR/fuzz-out/TARGET.corpus) for inspection
#   FUZZ_ARGS=...   more libFuzzer flags, e.g. "-seed=1 -runs=100000"
# The binaries need no Lua or clang where they run: they may be copied with BUILD_DIR/fuzz/ to
# another machine (with /usr/local/cuda/lib64) and run there by this script from a checkout.
set -u
build="$1"; shift
seconds="${FUZZ_SECONDS:-60}"
jobs="${FUZZ_JOBS:-1}"
src="$(cd "$(dirname "$0")/.." && pwd)"
out="$build/fuzz-out"
mkdir -p "$out"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$src/scripts/lsan.supp:print_suppressions=0}"
export KILN_CACHE=off
export KILN_JOBS=1

# The largest input each target is given, in bytes: enough for its seeds (a tiny model, a
# bundle), small enough that one execution stays fast.
max_len() {
    case "$1" in
    fuzz_gguf|fuzz_bundle|fuzz_cache) echo 32768 ;;
    fuzz_kg) echo 8192 ;;
    fuzz_compile) echo 4096 ;;
    *) echo 4096 ;;
    esac
}

seeds="$out/seeds"
rm -rf "$seeds"
if [ -x "$build/fuzz/fuzz_seeds" ]; then
    "$build/fuzz/fuzz_seeds" "$seeds" >"$out/seeds.log" 2>&1 || echo "fuzz.sh: fuzz_seeds failed (see $out/seeds.log); committed corpus only"
fi

fail=0
table=""
for t in "$@"; do
    bin="$build/fuzz/$t"
    corpus="$out/$t.corpus"
    art="$out/$t"
    log="$out/$t.log"
    rm -rf "$corpus"
    mkdir -p "$corpus" "$art"
    [ -d "$src/tests/fuzz/corpus/$t" ] && cp "$src/tests/fuzz/corpus/$t/"* "$corpus/" 2>/dev/null
    [ -d "$seeds/$t" ] && cp "$seeds/$t/"* "$corpus/" 2>/dev/null
    dict=""
    [ -f "$src/tests/fuzz/$t.dict" ] && dict="-dict=$src/tests/fuzz/$t.dict"
    par=""
    [ "$jobs" -gt 1 ] && par="-fork=$jobs"
    before=$(ls "$art" | wc -l)
    echo "== $t: $seconds s, $jobs job(s), corpus $(ls "$corpus" | wc -l) inputs, log $log"
    # shellcheck disable=SC2086
    "$bin" $par $dict -max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$art/" ${FUZZ_ARGS:-} "$corpus" >"$log" 2>&1
    rc=$?
    # One process: libFuzzer's final stats. -fork: the last status line's total executions over
    # its time (all processes together).
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    if [ -z "$execs" ]; then
        last=$(grep -E '^#[0-9]+' "$log" | tail -1)
        execs=$(echo "$last" | sed -n 's/^#\([0-9]*\).*/\1/p')
        secs=$(echo "$last" | sed -n 's/.* time: \([0-9]*\)s.*/\1/p')
        [ -n "$execs" ] && [ "${secs:-0}" -gt 0 ] && rate=$((execs / secs))
    fi
    found=$(($(ls "$art" | wc -l) - before))
    if [ "$rc" -ne 0 ] || [ "$found" -gt 0 ]; then
        fail=$((fail + 1))
        # A sanitizer's or libFuzzer's own report first: libFuzzer's status lines say
        # "oom/timeout/crash" whatever happened.
        what=$(grep -m1 -oE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer): [a-z-]+|runtime error' "$log")
        [ -n "$what" ] || what=$(grep -m1 -oE 'deadly signal|timeout after [0-9]+ seconds|out-of-memory' "$log")
        result="FAILED (rc $rc, ${what:-see log}; $found new input(s) in $art/)"
        [ "$rc" -ne 0 ] && tail -40 "$log"
    else
        result="ok"
    fi
    [ "${FUZZ_KEEP:-0}" = 1 ] || rm -rf "$corpus"
    table="$table$(printf '%-14s %12s %9s  %s' "$t" "${execs:-?}" "${rate:-?}" "$result")
"
done
echo
echo "fuzz summary ($seconds s per target, FUZZ_JOBS=$jobs):"
printf '%-14s %12s %9s  %s\n' target executions exec/s result
printf '%s' "$table"
if [ "$fail" -ne 0 ]; then
    echo "FAILED: $fail target(s) found a crash, leak, timeout or sanitizer error"
    exit 1
fi
echo "all $# targets ran without a finding"
