#!/usr/bin/env bash
# One-GPU work spread over a multi-GPU machine (the device tool's x2/x4 kinds): each command runs at once
# on a GPU of its own (CUDA_VISIBLE_DEVICES=k, so it sees one GPU and names the device `...-x1`). The
# record's three shards and a probe take one call's wall time instead of four calls'.
# Lane k's stdout and stderr go to $OUT/lanes/lane<k>.txt and its files to $LANE_OUT ($OUT/lanes/<k>/).
# Every lane ends by LANE_TIMEOUT (its whole process group is stopped), then $OUT/lanes is packed into
# $OUT/lanes.tgz: the device tool returns at most 8 files, so many lanes' files come back as one.
#   [LANE_TIMEOUT=560] tools/gpu_lanes.sh 'command on GPU 0' 'command on GPU 1' ...
# In a command, $LANE ($k) and $LANE_OUT are set; quote the commands so they expand there.
# Timed perf runs do not share a machine: the suite's timing lock is one per device slug, so a second
# lane's `pytest perf` is refused while another lane times (its host load would be in their timings).
# Lanes suit the record's shards and the probes, which take no lock.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:=out/lanes}" "${LANE_TIMEOUT:=560}"
[[ $# -ge 1 ]] || { echo "gpu_lanes.sh: no command given (one per GPU)" >&2; exit 2; }
# an earlier run's files are kept: a second run into the same OUT is refused, not packed over them
[[ ! -e "$OUT/lanes.tgz" && ! -e "$OUT/lanes" ]] || { echo "gpu_lanes.sh: $OUT holds an earlier run's lanes" >&2; exit 2; }
if command -v nvidia-smi >/dev/null; then
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
  (( $# <= gpus )) || { echo "gpu_lanes.sh: $# commands for $gpus GPU(s)" >&2; exit 2; }
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT/lanes"
k=0
for cmd in "$@"; do
  mkdir -p "$OUT/lanes/$k"
  (export CUDA_VISIBLE_DEVICES=$k LANE=$k LANE_OUT="$OUT/lanes/$k"
   echo "lane $k ($(date -u +%T)): $cmd"
   timeout -k 5 "$LANE_TIMEOUT" bash -c "$cmd"; echo "lane $k rc=$? ($(date -u +%T))") > "$OUT/lanes/lane$k.txt" 2>&1 &
  k=$((k + 1))
done
wait
tail -n 3 "$OUT"/lanes/lane*.txt
tar czf "$OUT/lanes.tgz" -C "$OUT" lanes && rm -rf "$OUT/lanes"
ls -la "$OUT"
