#!/bin/sh
# Here (the build machine): strip kiln and the GPU test programs into build-dev/ (ignored, under
# the 64 MiB the device tool carries), noting the commit. Then run with carry ["build-dev"].
# Usage: scripts/device/pack.sh   (after make test-build test-gpu-build)
set -eu
cd "$(dirname "$0")/../.."
rm -rf build-dev && mkdir -p build-dev/tests/gpu
cp build/kiln build-dev/ && cp build/tests/gpu/test_* build-dev/tests/gpu/
strip build-dev/kiln build-dev/tests/gpu/*
# kiln serve loads libmicrohttpd; the GPU machines may lack it (test_gpu_serve; gpu-suite.sh
# points LD_LIBRARY_PATH here)
for l in /usr/lib/x86_64-linux-gnu/libmicrohttpd.so.12; do
    [ -e "$l" ] && mkdir -p build-dev/lib && cp -L "$l" build-dev/lib/
done
{ git log --oneline -1; git status --short | sed 's/^/  uncommitted: /'; } > build-dev/BUILT_AT
du -sh build-dev
