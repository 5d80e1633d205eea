#!/usr/bin/env bash
# The 2026 leaderboard's cold start, on the lent 2-GPU machine (the `device` tool): "from an empty
# PyTorch/Triton cache, your benchmarking run must complete within 10 minutes". Runs one candidate of
# `perf/test_leaderboard_2026.py -k two_gpus` (default: the fastest measured) with Triton's and Inductor's
# on-disk caches pointed at new empty folders, so nothing compiled earlier on the machine is reused. The
# row records what the caches held at its first call (details.first_call_caches: both 0 here) and the
# run's wall time to its end (details.run_wall_s); the whole command's wall time, pytest's start-up
# included, goes to $OUT/cold.txt. File the JSON with `python -m impl.bench.store FILE --section leaderboard_2026`.
#   [SUITE_COMMIT=abc1234] tools/leaderboard_cold.sh ["PYTEST_K_EXPR"]
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:=out/cold}"
mkdir -p "$OUT"
# One candidate only: the rows after the first in the same process start from caches the first filled
# (2785450: the old default also matched the three LM-head candidates, which then ran warm).
KEXPR=${1:-"two_gpus and keep_attention-12-pointwise-flash_gluon-expandable_segments and lm_head_triton"}
TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)
export TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR
SECONDS=0
OUT="$OUT" tools/gpu_run.sh "leaderboard_2026:$KEXPR"
rc=$?
printf 'command: tools/gpu_run.sh "leaderboard_2026:%s" from empty caches (TRITON_CACHE_DIR=%s, TORCHINDUCTOR_CACHE_DIR=%s)\nwall_s: %d\nrc: %d\n' \
  "$KEXPR" "$TRITON_CACHE_DIR" "$TORCHINDUCTOR_CACHE_DIR" "$SECONDS" "$rc" | tee "$OUT/cold.txt"
exit $rc
