#!/bin/sh
# On 2 GPUs (or 4: G=4): the issue-30 measurements after tp-check.sh passes. Llama-3-8B from a
# file, 32 greedy tokens on one GPU, over G by tensor parallelism and over G stages (the
# generated lines compared); then the 70B-shaped preset's bench rows over G GPUs, tp and pp.
set -u
B=${B:-build-dev}
O=${OUT:-/tmp/out}
G=${G:-2}
mkdir -p "$O"
. "$(dirname "$0")/nccl-env.sh"
export KILN_CACHE_DIR=/tmp/kc
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
"$B/kiln" gen-model --preset llama-3-8b -o /tmp/8b.gguf > /dev/null 2>&1
el "8B file written rc=$?"
for how in "" "--tp $G" "--pp $G"; do
    timeout 150 "$B/kiln" run /tmp/8b.gguf --tokens 1,17,300,5,999,42,8 -n 32 --ignore-eos --stats $how > /tmp/r.txt 2>&1
    echo "8b [$how] rc=$? $(grep -a '^generated' /tmp/r.txt)" | tee -a "$O/runs-8b.txt"
    grep -a '^decode' /tmp/r.txt | tee -a "$O/runs-8b.txt"
done
rm -f /tmp/8b.gguf
el "8B runs done"
for how in "--tp $G" "--pp $G"; do
    timeout 240 "$B/kiln" bench --quick --no-torch --models-only --models llama-3-70b --kv 512,4096 $how \
        --json "$O/70b$(echo $how | tr -dc a-z0-9).json" > /tmp/b.txt 2>&1
    el "70B bench [$how] rc=$?"
    grep -aA6 '^model' /tmp/b.txt | head -8
    tail -2 /tmp/b.txt
done
