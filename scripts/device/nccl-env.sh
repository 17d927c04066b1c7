# shellcheck shell=sh
# Sourced: NCCL for kiln on a multi-GPU machine. NVLink multicast off (the machines' rule); the
# system's libnccl.so.2, else PyTorch's nvidia-nccl wheel, named in KILN_NCCL_LIB.
export NCCL_NVLS_ENABLE=0
lib=$(ldconfig -p 2>/dev/null | awk '/libnccl.so.2/{print $NF; exit}')
if [ -z "$lib" ]; then
    for d in $(python3 -c "import nvidia.nccl as m; print(' '.join(m.__path__))" 2>/dev/null); do
        [ -f "$d/lib/libnccl.so.2" ] && lib="$d/lib/libnccl.so.2" && break
    done
fi
export KILN_NCCL_LIB="$lib"
echo "NCCL: ${lib:-not found}"
