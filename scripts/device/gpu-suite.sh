#!/bin/sh
# On a GPU machine: every GPU test program at once (or $TESTS), each killed after $TLIM s
# (default 540), then a summary and the failures' lines; the logs in one $OUT/gpu-logs.tgz
# (the device tool brings back 8 files at most). Usage: sh scripts/device/gpu-suite.sh
set -u
B=${B:-build-dev}
O=${OUT:-/tmp/out}
mkdir -p "$O/t"
# libraries pack.sh copied (libmicrohttpd for kiln serve), when the machine has none of its own
if [ -d "$B/lib" ] && ! ldconfig -p 2>/dev/null | grep -q libmicrohttpd.so.12; then
    export LD_LIBRARY_PATH="$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
cat "$B/BUILT_AT" 2>/dev/null
start=$(date +%s)
# one(NAME PROGRAM [VAR=VALUE...]): a program (or a part of one) with its log, cache and result
one() {
    (
        nm=$1 prog=$2
        shift 2
        s=$(date +%s)
        env "$@" KILN_BIN=$B/kiln KILN_SRC=$PWD KILN_CACHE_DIR=/tmp/cache-$nm CK_DEFAULT_TIMEOUT=900 \
            timeout "${TLIM:-540}" "$prog" > "$O/t/$nm.log" 2>&1
        echo "$nm rc=$? $(($(date +%s) - s))s $(grep -aE '^[0-9]+%: Checks' "$O/t/$nm.log" | tail -1)" > "$O/t/$nm.rc"
    ) &
}
for t in ${TESTS:-$B/tests/gpu/test_*}; do
    n=$(basename "$t")
    if [ "$n" = test_gpu_ops ]; then
        # the longest program, one NVRTC compile at a time: its elementwise cases in 4 shares
        # (KILN_TEST_SHARD), its other cases apart
        for k in 0 1 2 3; do one "$n.ew$k" "$t" CK_RUN_CASE=elementwise KILN_TEST_SHARD=$k/4; done
        for c in fused session examples; do one "$n.$c" "$t" CK_RUN_CASE=$c; done
    else
        one "$n" "$t"
    fi
done
wait
sort "$O"/t/*.rc | tee "$O/summary.txt"
for f in "$O"/t/*.rc; do
    grep -q 'rc=0 ' "$f" && continue
    n=$(basename "$f" .rc)
    echo "=== $n"
    grep -aE ':F:|:E:' "$O/t/$n.log" | head -12 | cut -c1-400
done
echo "suite: $(($(date +%s) - start)) s"
tar czf "$O/gpu-logs.tgz" -C "$O" t && rm -rf "$O/t"
