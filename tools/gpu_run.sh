#!/usr/bin/env bash
# Runs on the lent GPU machine (the `device` tool): chosen perf sections in the full profile and,
# optionally, the correctness tests. Each section's JSON lands in $OUT/data as soon as it ends, so a
# command stopped at the device's time limit still returns what finished (at most 8 files come back).
# File them here with `python -m impl.bench.store FILE.json` (a run stopped early is refused).
#   [SUITE_COMMIT=abc1234] [CORRECTNESS="correctness/test_x.py ..."] [SECTION_TIMEOUT=540] tools/gpu_run.sh SECTION[:PYTEST_K_EXPR]|correctness ...
# SUITE_COMMIT names the commit whose tree the device tool sent: the runs record it (the machine's git
# HEAD is the session's first commit, so without it a run reads "<that commit>+").
# SECTION_TIMEOUT stops a section between tests (pytest-timeout's session timeout), so its JSON is
# still written when the grid runs long; the missing rows then show as absent in the report.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:=out/gpu}"
mkdir -p "$OUT/data" "$OUT/artifacts"
export SUITE_PROFILE=full SUITE_ARTIFACTS_DIR="$OUT/artifacts" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=$(tools/setup.sh)
slug=$(PYTHONPATH=src $PY -c "from impl.bench.store import device_slug; print(device_slug())")
echo "device slug: $slug; commit recorded: ${SUITE_COMMIT:-git HEAD + dirty (SUITE_COMMIT unset)}"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/nvidia-smi.txt"
# The word `correctness` among the sections runs the files in $CORRECTNESS at that point.
run_correctness() {
  # the whole log goes to $OUT as it is written: a command stopped at its limit still returns it
  PYTHONPATH=src $PY -m pytest $CORRECTNESS -q -p no:cacheprovider --timeout=300 2>&1 | tee "$OUT/correctness.txt" | tail -25
}
for spec in "$@"; do
  [[ "$spec" == correctness ]] && { run_correctness; continue; }
  section=${spec%%:*}; kexpr=""; [[ "$spec" == *:* ]] && kexpr=${spec#*:}
  tag=$section${kexpr:+-$(printf %s "$kexpr" | tr -c "a-zA-Z0-9_" "_")}
  echo "=== $tag ($(date +%T))"
  PYTHONPATH=src $PY -m pytest "perf/test_$section.py" ${kexpr:+-k "$kexpr"} -q -p no:cacheprovider --timeout=900 --session-timeout="${SECTION_TIMEOUT:-540}" \
    --benchmark-json="$OUT/data/$tag.json" --benchmark-columns=mean,stddev,rounds 2>&1 | tail -8
done
ls -laR "$OUT"
