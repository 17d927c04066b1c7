#!/bin/sh
# On a GPU machine: every GPU test program at once (or $TESTS), each killed after $TLIM s
# (default 540), then a summary and the failures' lines; the logs in one $OUT/gpu-logs.tgz
# (the device tool brings back 8 files at most). Usage: sh scripts/device/gpu-suite.sh
set -u
B=${B:-build-dev}
O=${OUT:-/tmp/out}
mkdir -p "$O/t"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
cat "$B/BUILT_AT" 2>/dev/null
start=$(date +%s)
for t in ${TESTS:-$B/tests/gpu/test_*}; do
    n=$(basename "$t")
    (
        s=$(date +%s)
        KILN_BIN=$B/kiln KILN_SRC=$PWD KILN_CACHE_DIR=/tmp/cache-$n CK_DEFAULT_TIMEOUT=900 \
            timeout "${TLIM:-540}" "$t" > "$O/t/$n.log" 2>&1
        echo "$n rc=$? $(($(date +%s) - s))s $(grep -aE '^[0-9]+%: Checks' "$O/t/$n.log" | tail -1)" > "$O/t/$n.rc"
    ) &
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
