#!/bin/sh
# Installs kiln's build and test dependencies (Debian/Ubuntu packages) when any is missing.
# Idempotent: does nothing when all are present. The CUDA toolkit (NVRTC) is expected in
# ${CUDA_HOME:-/usr/local/cuda}.
set -e
PKGS="liblua5.4-dev libxxhash-dev libjansson-dev libmicrohttpd-dev check pkg-config"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "install-deps: installing$missing"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y $missing
fi
cuda="${CUDA_HOME:-/usr/local/cuda}"
if [ ! -f "$cuda/include/nvrtc.h" ]; then
    echo "install-deps: the CUDA toolkit (NVRTC) was not found in $cuda; set CUDA_HOME" >&2
    exit 1
fi
