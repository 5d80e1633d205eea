#!/usr/bin/env bash
# Issue 42's repeat, on the lent GPU machine (the `device` tool): the command that once failed on NCCL
# (the four distributed correctness files, serially, with -x) N times within a budget, on each pair
# of GPUs at once (0,1 and 2,3 on a 4-GPU machine), every repetition's outcome kept
# (impl.bench.repeat). Two files come back under $OUT: repeat.json (the summary, whole after every
# repetition) and repeat.log. File the summary here with
#   PYTHONPATH=src python -m impl.bench.repeat file <files_at>/repeat.json
#   [SUITE_COMMIT=abc1234] tools/nccl_repeat.sh --n 20 --budget-s 540 [--estimate-s 200] [--pairs 0,1 2,3] [--cpu]
# SUITE_COMMIT names the commit whose tree the device tool sent (as for tools/gpu_run.sh).
# --budget-s must leave the call's limit (600 s) room for the set-up (~20 s) and the return of $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:=out/repeat}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=$(tools/setup.sh)
echo "commit recorded: ${SUITE_COMMIT:-git HEAD + dirty (SUITE_COMMIT unset)}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
PYTHONPATH=src exec "$PY" -m impl.bench.repeat run --out "$OUT" "$@"
