#!/usr/bin/env bash
# Set up .venv for pimm_fn: `scripts/setup.sh` for the demo, `scripts/setup.sh test` for the test suite,
# `scripts/setup.sh bench` for the benchmarks. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-data}"
case "$extra" in data|test|bench) ;; *) echo "usage: scripts/setup.sh [data|test|bench]" >&2; exit 2 ;; esac

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

# Pin torch first and explicitly: an unpinned torch would resolve to the newest release, and pip
# would then take a multi-GB CUDA build even on machines without a GPU.
torch_version=${PIMM_FN_TORCH:-2.13.0}
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  "${pip[@]}" install "torch==${torch_version}"
fi
extras="data"
[ "$extra" = test ] && extras="data,test"
[ "$extra" = bench ] && extras="data,test,bench"
"${pip[@]}" install -e ".[${extras}]"
.venv/bin/python -c "import torch, pimm_fn; print(f'pimm_fn ready: torch {torch.__version__}')"
