#!/bin/sh
# Per-op bandwidth on the GPU: runs each bench/ops/*.kg graph with `kiln run` and prints the
# median replay time and the achieved bandwidth over the graph's inputs and outputs (bytes read
# once plus bytes written once), as a share of the H100's ~3.0 TB/s.
# Usage: scripts/bench-ops.sh [KILN] [GRAPH...]
set -u
KILN=${1:-build/kiln}
[ $# -gt 0 ] && shift
GRAPHS=${*:-$(ls bench/ops/*.kg)}
PEAK=${KILN_PEAK_GBS:-3000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# get_rows graphs read an `ids` input: a permutation of 0..8191, so every row is read once.
if command -v python3 >/dev/null 2>&1; then
    python3 -c "import struct,random; r=list(range(8192)); random.seed(1); random.shuffle(r); open('$tmp/ids.bin','wb').write(struct.pack('<8192i',*r))"
fi
printf '%-28s %10s %10s %8s\n' graph "median ms" "GB/s" "% peak"
for g in $GRAPHS; do
    extra=""
    if grep -q '^input ids: i32\[8192\]' "$g" && [ -f "$tmp/ids.bin" ]; then extra="--input ids=$tmp/ids.bin"; fi
    out=$("$KILN" run "$g" --iters 50 $extra 2>&1)
    line=$(printf '%s\n' "$out" | grep '^bandwidth:')
    if [ -z "$line" ]; then
        printf '%-28s FAILED: %s\n' "$(basename "$g" .kg)" "$(printf '%s\n' "$out" | tail -1)"
        continue
    fi
    ms=$(printf '%s\n' "$line" | sed 's/.* in \([0-9.]*\) ms.*/\1/')
    gbs=$(printf '%s\n' "$line" | sed 's/.* = \([0-9]*\) GB\/s.*/\1/')
    printf '%-28s %10s %10s %7s%%\n' "$(basename "$g" .kg)" "$ms" "$gbs" "$(( gbs * 100 / PEAK ))"
done
