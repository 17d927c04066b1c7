#!/bin/sh
# On one GPU: the batched decode rows of a quantized 8B with and without the program for steps
# of at most 64 tokens (--batch-small 64, kiln_batch_opts.n_small), in one call (issue 28).
set -u
B=${B:-build-dev}
O=${OUT:-/tmp/out}
mkdir -p "$O"
for small in "" "--batch-small 64"; do
    KILN_CACHE_DIR=/tmp/bc timeout 240 "$B/kiln" bench --quick --no-torch --batch-only --batch llama-3-8b:q4_k_m \
        $small > /tmp/b.txt 2>&1
    echo "== [$small] rc=$?"
    grep -aA5 '^model' /tmp/b.txt
    cp /tmp/b.txt "$O/batch$(echo $small | tr -dc 0-9).txt"
done
