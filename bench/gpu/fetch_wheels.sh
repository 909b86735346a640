#!/usr/bin/env bash
# Gather the wheel set of a pinned list (default bench/gpu/wheels_032.txt: vLLM 0.32.0 + torch
# 2.13.0 for the offline H200 host, Python 3.12), tar it and split it into parts of PART_MIB MiB
# (default 36: a part and the checkout, 24.9 MiB of disk after the 2026-12-07 passes, stay under
# the 64 MiB a call carries, counted as disk use; bench/gpu/README.md).
#   bash bench/gpu/fetch_wheels.sh DEST [LIST]     (DEST: a git-ignored folder of the checkout)
# Wheels already in $WHEEL_CACHE (default /tmp/vdl) are copied instead of downloaded.
# Leaves DEST/chunk1 ... DEST/chunkN (one part each) and DEST/SHA256 (of the whole tar), plus
# DEST/scripts from bench/gpu/host (receive.sh, install.sh, env.sh for the host).
set -euo pipefail
dest=${1:?usage: bench/gpu/fetch_wheels.sh DEST [LIST]}
here=$(cd "$(dirname "$0")" && pwd)
list=${2:-$here/wheels_032.txt}
cache=${WHEEL_CACHE:-/tmp/vdl}
rm -rf "$dest/.whl" "$dest"/chunk* "$dest"/whl.tar* "$dest/SHA256"
mkdir -p "$dest/.whl"
reqs=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$list" | grep -v '^$')
todo=$(mktemp)
for req in $reqs; do
  name=$(echo "${req%%==*}" | tr 'A-Z.-' 'a-z__'); ver=${req#*==}
  hit=$(find "$cache" -maxdepth 1 -iname "${name}-${ver}-*.whl" 2>/dev/null | head -1 || true)
  if [ -n "$hit" ]; then cp "$hit" "$dest/.whl/"; else echo "$req" >> "$todo"; fi
done
echo "$(ls "$dest/.whl" | wc -l) wheels from $cache, $(wc -l < "$todo") to download"
plat=""; for n in $(seq 5 39); do plat="$plat --platform manylinux_2_${n}_x86_64"; done
if [ -s "$todo" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $plat --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest/.whl" -r "$todo"
fi
rm -f "$todo"
n=$(ls "$dest/.whl" | wc -l); want=$(echo "$reqs" | wc -l)
[ "$n" -eq "$want" ] || { echo "expected $want wheels, got $n" >&2; exit 1; }
echo "$n wheels, $(du -sm "$dest/.whl" | cut -f1) MiB"
(cd "$dest" && tar -cf whl.tar .whl && sha256sum whl.tar | cut -d' ' -f1 > SHA256 \
  && split -b "${PART_MIB:-36}M" -d -a 3 whl.tar whl.tar.part && rm whl.tar)
k=0; for part in "$dest"/whl.tar.part*; do k=$((k+1)); mkdir -p "$dest/chunk$k"; mv "$part" "$dest/chunk$k/"; done
cp "$dest/SHA256" "$dest/chunk$k/"
mkdir -p "$dest/scripts" && cp "$here"/host/*.sh "$dest/scripts/"
echo "$k chunks in $dest/chunk1..$k; carry one per call (receive.sh), then run install.sh"
