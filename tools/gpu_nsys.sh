#!/usr/bin/env bash
# Runs on the lent GPU machine (the `device` tool, carry [".nsys-debs"] from tools/nsys_fetch.sh):
# Nsight Systems profiles of the named case groups (impl.nsys.cases), each case its own
# `nsys profile` process with NVTX ranges; its .nsys-rep, trimmed SQLite export and `nsys stats`
# CSVs are packed into $OUT/nsys/nsys-*.tar with $OUT/nsys/manifest.json, rewritten after every case
# so a command stopped at the time limit still returns what finished. Unpack them here with
# `python -m impl.nsys.outputs unpack DIR DEST`.
#   [NSYS_BUDGET_S=420] [NSYS_MAX_PARTS=6] tools/gpu_nsys.sh GROUP... [--only TEXT]...
# The device returns 8 files of $OUT: manifest, log and at most NSYS_MAX_PARTS parts; lower it by one for
# every other file the same call leaves under $OUT, or a part is lost (2026-11-26: nsys-3.tar of 3).
#   GROUP: nsys_profile memory_profiling ddp fsdp
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:=out/gpu}"
: "${NSYS_DEBS:=.nsys-debs}"
: "${NSYS:=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}"
# First, before anything is set up: without the carried packages nsys writes only a .qdstrm.
missing=()
for p in libdw1 libelf1; do compgen -G "$NSYS_DEBS/${p}_*.deb" >/dev/null || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "gpu_nsys: $NSYS_DEBS/ lacks the Debian package(s) ${missing[*]} (nsys's importer needs libdw.so.1):" \
       "run tools/nsys_fetch.sh on the CPU machine and pass carry=[\"$NSYS_DEBS\"] to the device tool" >&2
  exit 2
fi
[[ -x "$NSYS" ]] || { echo "gpu_nsys: no nsys executable at $NSYS (set NSYS=...)" >&2; exit 2; }
# Unpacked beside, never into /: only nsys's importer loads them, through LD_LIBRARY_PATH.
libs=/tmp/nsys-libs
mkdir -p "$libs"
for f in "$NSYS_DEBS"/*.deb; do dpkg -x "$f" "$libs" || { echo "gpu_nsys: dpkg -x $f failed" >&2; exit 2; }; done
export LD_LIBRARY_PATH="$libs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NSYS SUITE_PROFILE=full PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=$(tools/setup.sh)
mkdir -p "$OUT/nsys"
nvidia-smi --query-gpu=name,memory.total --format=csv
# the log goes to $OUT as it is written: a command stopped at its limit still returns it
PYTHONPATH=src $PY -m impl.nsys.run --out "$OUT/nsys" --budget-s "${NSYS_BUDGET_S:-420}" "$@" 2>&1 | tee "$OUT/nsys/log.txt"
rc=${PIPESTATUS[0]}
ls -la "$OUT/nsys"
exit "$rc"
