#!/bin/sh
# The main job (make run): write a tiny Llama with random weights as GGUF (or take $KILN_MODEL),
# compile its whole graph with the CUDA dumped, then generate 64 tokens greedily on the GPU with
# every step checked against the CPU reference. Without a GPU it generates on the CPU reference
# instead, says so, and still succeeds.
set -u
kiln="$1"
dump="build/dump"
model="${KILN_MODEL:-}"
if [ -z "$model" ]; then
    model="build/tiny-llama.gguf"
    mkdir -p build
    echo "== kiln gen-model --arch llama --preset tiny -o $model"
    "$kiln" gen-model --arch llama --preset tiny -o "$model" || exit 1
fi
echo "== kiln compile $model --dump-cu $dump"
rm -rf "$dump"
"$kiln" compile "$model" --dump-cu "$dump" || exit 1
echo "== generated kernels: $(ls -1 "$dump" | grep -c '\.cu$') files in $dump, e.g.:"
ls -1 "$dump" | head -8
check=""
[ -z "${KILN_MODEL:-}" ] && check="--check"
echo "== kiln run $model --tokens 1,2,3 -n 64 $check"
"$kiln" run "$model" --tokens 1,2,3 -n 64 $check
rc=$?
if [ "$rc" -eq 3 ]; then
    echo "make run: no CUDA driver or GPU on this machine: the model was compiled and dumped (see $dump);"
    echo "          generating on the CPU reference instead (slow, but the same tokens):"
    echo "== kiln run $model --tokens 1,2,3 -n 16 --cpu"
    "$kiln" run "$model" --tokens 1,2,3 -n 16 --cpu
    exit $?
fi
exit "$rc"
