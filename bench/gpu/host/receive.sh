#!/usr/bin/env bash
# On the GPU host, from the checkout root: keep part K in /tmp/chunks (which lives as long as the
# host does).   bash receive.sh DEST K      (DEST: .gpu-wheels-032, carried one chunkK per call)
set -euo pipefail
dest=${1:?usage: receive.sh DEST K}; k=${2:?usage: receive.sh DEST K}
mkdir -p /tmp/chunks && cp "$dest/chunk$k"/* /tmp/chunks/
echo "part $k received; /tmp/chunks holds $(ls /tmp/chunks/whl.tar.part* | wc -l) parts"
