#!/bin/sh
# On a machine of 2 GPUs (kind nvidia-h100-x2): tensor parallelism end to end. The collective
# tests; kiln run --tp 2 against one GPU and the CPU reference on tiny models (tokens compared,
# and the process must end: a hang at its end was seen); the 8B bench rows over 1 and 2 GPUs;
# a profile of the 2-GPU decode step (the all-reduce time per layer). Logs in $OUT.
set -u
B=${B:-build-dev}
O=${OUT:-/tmp/out}
mkdir -p "$O"
. "$(dirname "$0")/nccl-env.sh"
export KILN_BIN=$B/kiln KILN_SRC=$PWD
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
KILN_CACHE_DIR=/tmp/cc timeout 300 "$B/tests/gpu/test_gpu_collective" > "$O/collective.log" 2>&1
el "test_gpu_collective rc=$?"
grep -aE '^[0-9]+%:|:F:|:E:|GPUs' "$O/collective.log" | cut -c1-300 | head -30
export KILN_CACHE_DIR=/tmp/kc
: > "$O/runs.txt"
for arch in llama qwen3moe deepseek2; do
    "$B/kiln" gen-model --preset tiny --arch $arch -o /tmp/$arch.gguf > /dev/null 2>&1
    for how in "--cpu" "" "--tp 2"; do
        timeout 90 "$B/kiln" run /tmp/$arch.gguf --tokens 1,17,300,5,999,42,8 -n 32 --ignore-eos $how > /tmp/r.txt 2>&1
        echo "$arch [$how] rc=$? $(grep -a '^generated' /tmp/r.txt)" | tee -a "$O/runs.txt"
    done
done
el "runs done"
for tp in 1 2; do
    timeout 200 "$B/kiln" bench --quick --no-torch --models-only --models llama-3-8b --kv 512,4096 --tp $tp \
        --json "$O/tp$tp.json" > "$O/tp$tp.txt" 2>&1
    el "bench --tp $tp rc=$?"
    grep -aA6 '^model' "$O/tp$tp.txt" | head -8
done
KILN_PROFILE=1 timeout 200 "$B/kiln" bench --quick --no-torch --models-only --models llama-3-8b --kv 512 --tp 2 \
    > "$O/tp2-profile.txt" 2>&1
el "profile rc=$?"
grep -aiE 'all_reduce|nccl' "$O/tp2-profile.txt" | head -10
