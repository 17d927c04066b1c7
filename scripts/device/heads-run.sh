#!/bin/sh
# device: the head_rope GPU tests, then the model rows before (kiln.base, d1417bf) and after
set -u
O=${OUT:-/tmp/out}
TESTS="build-dev/tests/gpu/test_gpu_fuse_head_rope build-dev/tests/gpu/test_gpu_model build-dev/tests/gpu/test_gpu_fuse_gemv_rope" TLIM=330 sh scripts/device/gpu-suite.sh 2>&1 | tail -30
for b in kiln.base kiln; do
  echo "== $b"
  KILN_CACHE_DIR=/tmp/bc-$b timeout 150 build-dev/$b bench --quick --no-torch --models-only --kv 512 \
    --models qwen3-30b-a3b,qwen3-30b-a3b:q4_k_m,gemma-3-4b > $O/bench-$b.txt 2>&1
  echo "rc=$?"; grep -aE "decode kv|prefill|^[a-z].*decode" $O/bench-$b.txt
done
