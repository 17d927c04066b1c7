#!/bin/sh
# The GPU machine's verification in one call: every GPU test program in parallel (one GPU, many
# NVRTC compiles on the CPU), each with its own log, then the per-op bandwidth table.
# Usage: scripts/gpu-check.sh OUTDIR   (after `make test-gpu-build` here or on a build machine)
set -u
OUT=${1:-gpu-check-out}
mkdir -p "$OUT"
pids=""
for t in build/tests/gpu/test_*; do
    n=$(basename "$t")
    ( KILN_CACHE_DIR="$OUT/cache-$n" "$t" > "$OUT/$n.log" 2>&1; echo "$n rc=$?" > "$OUT/$n.rc" ) &
    pids="$pids $!"
done
for p in $pids; do wait "$p"; done
cat "$OUT"/*.rc
for t in build/tests/gpu/test_*; do n=$(basename "$t"); echo "== $n"; grep -E "^[0-9]+%:|:F:|:E:" "$OUT/$n.log" | head -8; done
KILN_CACHE_DIR="$OUT/cache-bench" scripts/bench-ops.sh build/kiln | tee "$OUT/bench-ops.txt"
rm -rf "$OUT"/cache-*
