#!/usr/bin/env bash
# Ground truth on a GPU machine (README, "Ground truth on a GPU"): the CUDA driver loads every fixture's
# fatbin containers and must agree with verify's verdicts, then preflight reads the real NVML. Needs only
# a stock Python with packaging, nvidia-ml-py, psutil, rich and jinja2: bwstack is laid out as its
# installed package in a temporary folder instead of being pip-installed. Results land in $OUT.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/bwstack-device}
mkdir -p "$out"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
mkdir -p "$site/bwstack"
cp -r bwstack/. "$site/bwstack/"
for stage in recipes verify images smoke nodes; do cp -r "$stage" "$site/bwstack/$stage"; done
export PYTHONPATH=$site PYTHONUNBUFFERED=1
nvidia-smi -L 2>&1 | tee "$out/nvidia-smi.txt"
python3 -m bwstack.verify.gpu_truth --out "$out" tests/fixtures 2>&1 | tee "$out/gpu-truth.txt"
python3 - "$out" <<'PY' 2>&1 | tee "$out/preflight.txt"
import sys
from pathlib import Path

from bwstack.nodes.preflight import request_for_recipe, run_preflight

report = run_preflight(request_for_recipe("sglang", arch="sm90", docker=False))
Path(sys.argv[1], "preflight.json").write_text(report.to_json())
report.print_table()
PY
