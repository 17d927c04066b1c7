#!/bin/sh
# On one GPU: every GPU test program (gpu-suite.sh), then the decode rows of the models a change
# touched, before (build-dev/kiln.base, another build put there by hand) and after, in one call.
# Usage: MODELS=a,b sh scripts/device/final-run.sh
set -u
O=${OUT:-/tmp/out}
TLIM=${TLIM:-420} sh scripts/device/gpu-suite.sh 2>&1 | tail -45
for b in kiln.base kiln; do
    [ -x build-dev/$b ] || continue
    echo "== $b"
    KILN_CACHE_DIR=/tmp/fr-$b timeout 200 build-dev/$b bench --quick --no-torch --models-only --kv 512 \
        --models "${MODELS:-llama-3.2-1b:q4_k_m,llama-3-8b:q4_k_m,qwen3-30b-a3b,qwen3-30b-a3b:q4_k_m,gemma-3-4b}" \
        > "$O/bench-$b.txt" 2>&1
    echo "rc=$?"
    grep -aE "decode kv|prefill" "$O/bench-$b.txt"
done
