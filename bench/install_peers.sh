#!/usr/bin/env bash
# Installs the peers the benchmark compares packfs with, and the Python packages it uses.
# A peer that cannot be installed is reported as missing by bench/run.py, not silently dropped.
set -uo pipefail
apt_pkgs=(squashfuse archivemount squashfs-tools fuse3)
if command -v apt-get >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null || echo "apt-get install failed" >&2
fi
python3 -m pip install -q ratarmount pillow matplotlib || echo "pip install failed" >&2
# torch/torchvision are optional (the DataLoader epoch runs when they import): the PyPI wheels
# pull several GB of CUDA libraries, so they are only installed on request.
if [ "${WITH_TORCH:-0}" = 1 ]; then
  python3 -m pip install -q torch torchvision || echo "torch install failed" >&2
fi
for tool in squashfuse squashfuse_ll archivemount mksquashfs ratarmount fusermount3; do
  printf '%-14s %s\n' "$tool" "$(command -v "$tool" || echo MISSING)"
done
