#!/bin/sh
# The report of issue 5: for each fusion pattern (bench/fusion/*.kg, each naming its pass in a
# "# fusion: NAME" line) and for the example layers, the number of kernel nodes (`kiln inspect`;
# attention's split-KV decode adds a combine step) and the median CUDA-graph replay time with every pass on, with only that pass off (--no-fuse=NAME), and with fusion off.
# Usage: scripts/bench-fusion.sh [KILN] [GRAPH...]
set -u
KILN=${1:-build/kiln}
[ $# -gt 0 ] && shift
GRAPHS=${*:-$(ls bench/fusion/*.kg examples/llama-layer.kg examples/qwen3moe-layer.kg)}
ITERS=${KILN_BENCH_ITERS:-200}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# kernels and ms of one configuration, as "K MS" (or "- FAILED")
measure() {
    out=$("$KILN" run "$@" --iters "$ITERS" 2>&1)
    k=$("$KILN" inspect "$@" 2>/dev/null | grep -cE '^k[0-9]+ ')
    ms=$(printf '%s\n' "$out" | sed -n 's/^bandwidth:.* in \([0-9.]*\) ms.*/\1/p' | head -1)
    if [ -z "$ms" ]; then ms=$(printf '%s\n' "$out" | sed -n 's/.*median \([0-9.]*\) ms.*/\1/p' | head -1); fi
    if [ -z "$k" ] || [ -z "$ms" ]; then echo "- FAILED:$(printf '%s\n' "$out" | tail -1)"; else echo "$k $ms"; fi
}
printf '%-22s %-14s %18s %18s %18s %8s\n' graph pass "fused: k / ms" "pass off: k / ms" "all off: k / ms" speedup
for g in $GRAPHS; do
    pass=$(sed -n 's/^# fusion: *\([a-z_]*\).*/\1/p' "$g" | head -1)
    extra=""
    moe=$(sed -n 's/^# bench-ids: *\([0-9]* [0-9]* [0-9]*\).*/\1/p' "$g" | head -1)
    if [ -n "$moe" ]; then
        python3 scripts/moe-ids.py ids $moe 1 "$tmp/moe.bin" >/dev/null && extra="--input ids=$tmp/moe.bin"
    fi
    set -- $(measure "$g" $extra); fk=$1 fms=$2
    if [ -n "$pass" ]; then set -- $(measure "$g" $extra --no-fuse="$pass"); pk=$1 pms=$2; else pk=- pms=-; fi
    set -- $(measure "$g" $extra --no-fuse); uk=$1 ums=$2
    base=$pms
    [ "$base" = "-" ] && base=$ums
    sp=$(awk -v a="$base" -v b="$fms" 'BEGIN { if (b > 0 && a > 0) printf "%.2fx", a / b; else print "-" }')
    printf '%-22s %-14s %8s / %-7s %8s / %-7s %8s / %-7s %8s\n' "$(basename "$g" .kg)" "${pass:-all}" "$fk" "$fms" "$pk" "$pms" \
        "$uk" "$ums" "$sp"
done
