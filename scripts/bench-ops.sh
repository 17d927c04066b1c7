#!/bin/sh
# Per-op bandwidth on the GPU: runs each bench/ops/*.kg graph with `kiln run` and prints the
# median replay time and the achieved bandwidth over the graph's inputs and outputs (bytes read
# once plus bytes written once), as a share of the H100's ~3.0 TB/s; beside it, where
# bench/torch_ops.py has a PyTorch program for the op and PyTorch is installed, PyTorch's time
# for the same computation in the same run, the TFLOP/s of both (matrix products, attention),
# and kiln's speed-up over PyTorch.
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
TORCH=""
if command -v python3 >/dev/null 2>&1 && python3 -c "import torch" >/dev/null 2>&1; then TORCH=1; fi
printf '%-30s %10s %8s %7s %8s %10s %8s %8s\n' graph "median ms" "GB/s" "% peak" "TFLOP/s" "torch ms" "torch TF" "speedup"
for g in $GRAPHS; do
    extra=""
    if grep -q '^input ids: i32\[8192\]' "$g" && [ -f "$tmp/ids.bin" ]; then extra="--input ids=$tmp/ids.bin"; fi
    # Attention graphs may want a causal mask: "# bench-mask: NAME causal" (NAME f16 [n_kv, n_q]:
    # 0 on and below the diagonal, -inf above).
    mk=$(sed -n 's/^# bench-mask: *\([A-Za-z_][A-Za-z0-9_]*\) causal.*/\1/p' "$g" | head -1)
    if [ -n "$mk" ]; then
        dims=$(sed -n "s/^input $mk: f16\[\([0-9]*\), *\([0-9]*\)\].*/\1 \2/p" "$g")
        python3 -c "import sys,array; k,q=map(int,sys.argv[1:3]); a=array.array('H',[0x0000]*(k*q))
for i in range(q):
    a[i*k+i+1:(i+1)*k]=array.array('H',[0xfc00]*(k-i-1))
open(sys.argv[3],'wb').write(a.tobytes())" $dims "$tmp/mask.bin" && extra="$extra --input $mk=$tmp/mask.bin"
    fi
    # MoE graphs say how to route: "# bench-ids: T U E" (T tokens, U distinct experts of E each).
    moe=$(sed -n 's/^# bench-ids: *\([0-9]* [0-9]* [0-9]*\).*/\1/p' "$g" | head -1)
    if [ -n "$moe" ]; then
        python3 scripts/moe-ids.py ids $moe 1 "$tmp/moe.bin" >/dev/null && extra="--input ids=$tmp/moe.bin"
    fi
    out=$("$KILN" run "$g" --iters 50 $extra 2>&1)
    line=$(printf '%s\n' "$out" | grep '^bandwidth:')
    if [ -z "$line" ]; then
        printf '%-30s FAILED: %s\n' "$(basename "$g" .kg)" "$(printf '%s\n' "$out" | tail -1)"
        continue
    fi
    ms=$(printf '%s\n' "$line" | sed 's/.* in \([0-9.]*\) ms.*/\1/')
    gbs=$(printf '%s\n' "$line" | sed 's/.* = \([0-9]*\) GB\/s.*/\1/')
    tms="-" tf="-" ttf="-" sp="-"
    if [ -n "$TORCH" ]; then
        t=$(python3 bench/torch_ops.py "$g" 2>/dev/null | tail -1)
        t=${t#"$g "}
        case "$t" in
        ms=*)
            tms=$(printf '%s\n' "$t" | sed 's/ms=\([0-9.]*\).*/\1/')
            fl=$(printf '%s\n' "$t" | sed 's/.*flops=\([0-9]*\).*/\1/')
            sp=$(awk -v a="$tms" -v b="$ms" 'BEGIN { printf "%.2fx", a / b }')
            if [ "$fl" -gt 0 ] 2>/dev/null; then
                tf=$(awk -v f="$fl" -v m="$ms" 'BEGIN { printf "%.1f", f / m / 1e9 }')
                ttf=$(awk -v f="$fl" -v m="$tms" 'BEGIN { printf "%.1f", f / m / 1e9 }')
            fi ;;
        *) printf '%s: torch %s\n' "$(basename "$g" .kg)" "$t" >> "$tmp/notes" ;;
        esac
    fi
    printf '%-30s %10s %8s %6s%% %8s %10s %8s %8s\n' "$(basename "$g" .kg)" "$ms" "$gbs" "$(( gbs * 100 / PEAK ))" "$tf" "$tms" "$ttf" "$sp"
done
[ -f "$tmp/notes" ] && cat "$tmp/notes"
exit 0
