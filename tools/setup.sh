#!/usr/bin/env bash
# Prints the python interpreter the suite should use, setting it up first if needed.
#  - If python3 already has torch and the test stack (the GPU box: no network), use it as is.
#  - Otherwise make .venv with the CPU build torch==2.13.0 (never an unpinned torch: that pulls a
#    multi-GB CUDA build) and the rest of the dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
probe='import torch, pytest, pytest_benchmark, hypothesis, matplotlib'
if [[ -x .venv/bin/python ]] && .venv/bin/python -c "$probe" 2>/dev/null; then
  echo "$PWD/.venv/bin/python"; exit 0
fi
if python3 -c "$probe" 2>/dev/null; then
  command -v python3; exit 0
fi
# the tested versions (constraints.txt); torch first, alone, so nothing else can pull a CUDA build
rest=(triton numpy pytest pytest-benchmark pytest-xdist pytest-timeout hypothesis matplotlib pygal pygaljs)
{
  if python3 -c 'import torch' 2>/dev/null; then
    # torch is there (a GPU box) but not the rest: keep that torch, add only what is missing.
    echo "setting up .venv on top of the installed torch ..."
    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install -q -c constraints.txt "${rest[@]:1}"
  else
    echo "setting up .venv (CPU torch 2.13.0) ..."
    python3 -m venv .venv
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q "torch==2.13.0"
    .venv/bin/pip install -q -c constraints.txt "${rest[@]}"
  fi
} 1>&2
echo "$PWD/.venv/bin/python"
