#!/bin/sh
# usage: scripts/dump-all.sh OUTDIR [KILN]   Writes the generated CUDA of every graph kiln can
# produce here — examples/, bench/ops/, bench/fusion/, each model preset's whole graph — for
# sm_90a and sm_80, fused and unfused, as OUTDIR/<graph>.<arch>[.nofuse]/ (kiln compile
# --dump-cu: each kernel's .cu and program.txt). A structural change must leave it
# byte-identical: `diff -r BEFORE AFTER`. Kernels compile through a cache in OUTDIR/../dump-cache
# (override: DUMP_CACHE), so a second run costs little NVRTC time.
set -u
out="$1"; kiln="${2:-build/kiln}"
cache="${DUMP_CACHE:-$(dirname "$out")/dump-cache}"
mkdir -p "$out" "$cache"
graphs="$out/graphs"; mkdir -p "$graphs"
for p in "llama tiny" "qwen2 tiny" "qwen3 tiny" "qwen3moe tiny" "llama llama-3.2-1b" "llama llama-3-8b" \
         "qwen3moe qwen3-30b-a3b"; do
    set -- $p
    "$kiln" gen-graph --arch "$1" --preset "$2" -o "$graphs/$1-$2.kg" || exit 1
done
fail=0
for g in examples/*.kg bench/ops/*.kg bench/fusion/*.kg "$graphs"/*.kg; do
    base=$(basename "$(dirname "$g")")-$(basename "$g" .kg)
    for arch in sm_90a sm_80; do
        for fuse in "" "--no-fuse"; do
            d="$out/$base.$arch${fuse:+.nofuse}"
            rm -rf "$d"
            if ! "$kiln" compile "$g" --arch "$arch" $fuse --cache-dir "$cache" --dump-cu "$d" >"$d.log" 2>&1; then
                echo "dump-all: $g ($arch $fuse) failed: $(tail -1 "$d.log")"; fail=1
            fi
            rm -f "$d.log"
        done
    done
done
echo "dump-all: $(find "$out" -name '*.cu' | wc -l) kernel sources in $out"
exit $fail
