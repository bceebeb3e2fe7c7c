#!/usr/bin/env bash
# The prepared check for a lent GPU machine, as one call of the device tool (see README, "Ground truth on
# a GPU"): the CUDA driver loads every fixture's fatbin containers and must agree with verify's verdicts,
# then preflight reads the real NVML. Needs only what that machine's image already has (packaging,
# nvidia-ml-py, psutil, rich, jinja2); results land in $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${OUT:-/tmp/bwstack-device}
mkdir -p "$out"
nvidia-smi -L 2>&1 | tee "$out/nvidia-smi.txt"
python3 -m verify.gpu_truth --out "$out" 2>&1 | tee "$out/gpu-truth.txt"
python3 - "$out" <<'PY' 2>&1 | tee "$out/preflight.txt"
import sys
from pathlib import Path

from verify.preflight import request_for_recipe, run_preflight

report = run_preflight(request_for_recipe("sglang", arch="sm90", docker=False))
Path(sys.argv[1], "preflight.json").write_text(report.to_json())
report.print_table()
PY
