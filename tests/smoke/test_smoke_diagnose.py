"""smoke's diagnosis: crash signatures to remedies, causes for every phase, process evidence, py-spy, NVML seam."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bwstack.smoke import diagnose as dx
from bwstack.smoke.gpu import UnavailableGpuSampler, open_gpu_sampler
from bwstack.smoke.phases import vocabulary


@pytest.mark.parametrize(
    ("line", "name", "remedy_words"),
    [
        (
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
            "no-kernel-image",
            "invoke verify",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "cuda-out-of-memory",
            "--mem-fraction-static",
        ),
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1, unhandled system error",
            "nccl-error",
            "NCCL_P2P_DISABLE=1",
        ),
        ("ModuleNotFoundError: No module named 'sgl_kernel'", "missing-module", "install it"),
        (
            "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address in use",
            "address-in-use",
            "--port",
        ),
        (
            "ImportError: /x/common_ops.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
            "undefined-symbol",
            "rebuild",
        ),
        (
            "RuntimeError: CUDA driver version is insufficient for CUDA runtime version",
            "driver-too-old",
            "580",
        ),
    ],
)
def test_crash_signatures_map_to_remedies(line: str, name: str, remedy_words: str) -> None:
    matches = dx.match_signatures(["INFO: starting", line, "Traceback (most recent call last):"])
    assert [m.signature.name for m in matches] == [name]
    assert matches[0].line == line and remedy_words in matches[0].signature.remedy


def test_ordinary_lines_match_no_signature() -> None:
    log = Path(__file__).with_name("test_smoke_phases.py").read_text().splitlines()
    assert dx.match_signatures(line for line in log if "Load weight" in line or "Capture" in line) == []


def test_every_phase_of_every_engine_has_causes_with_something_to_try() -> None:
    for engine in ("sglang", "vllm"):
        for name in vocabulary(engine).names:
            causes = dx.causes_for(name)
            assert name == "ready" or causes, (engine, name)
            assert all(c.tries for c in causes)


def test_the_incident_phase_points_at_kernels_nccl_and_py_spy() -> None:
    tries = [t for c in dx.causes_for("shards-loaded") for t in c.tries]
    assert any("invoke verify" in t for t in tries)
    assert any("NCCL_P2P_DISABLE=1" in t and "NCCL_CUMEM_ENABLE=0" in t for t in tries)
    assert any("py-spy" in t for t in tries)
    assert "--disable-cuda-graph" in " ".join(t for c in dx.causes_for("cuda-graph") for t in c.tries)
    assert "--attention-backend" in " ".join(t for c in dx.causes_for("memory-pool") for t in c.tries)
    assert dx.causes_for("loading-weights", busy=True)[0] is dx.SLOW_START
    assert "completion" in dx.causes_for("listening", failing_probe="completion")[0].cause


def test_snapshot_and_py_spy_dump_of_a_sleeping_python_process() -> None:
    code = "import time\ndef napping():\n    print('napping', flush=True); time.sleep(60)\nnapping()"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "napping\n"  # in napping(), not importing
        process = psutil.Process(child.pid)
        snapshot = dx.snapshot_process(process)
        assert snapshot is not None
        assert snapshot["state"] == "S" and snapshot["python"] is True
        assert snapshot["wchan"] and snapshot["thread_states"] == {"S": 1}
        assert dx.process_summary([snapshot]).startswith("1 processes (1 S)")
        py_spy = dx.find_py_spy()
        assert py_spy is not None, "py-spy is a dev dependency"
        dumps = dx.py_spy_dumps([child.pid], py_spy)
        assert dumps["dumps"][0]["ok"]
        assert (dx.main_thread_frame(dumps["dumps"][0]["text"]) or "").startswith("napping (<string>:3)")
    finally:
        child.kill()
        child.wait()


def test_without_py_spy_the_diagnosis_says_so() -> None:
    dumps = dx.py_spy_dumps([1], None)
    assert dumps["available"] is False and "py-spy is not installed" in dumps["note"]


def test_nvml_seam_reports_why_it_is_unavailable_here() -> None:
    sampler = open_gpu_sampler()
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        nvml_works = True
    except Exception:
        nvml_works = False
    assert sampler.available is nvml_works
    if not nvml_works:
        assert sampler.read() == [] and "NVML" in sampler.reason
        assert dx.gpu_evidence(sampler) == {"available": False, "reason": sampler.reason, "gpus": []}
    sampler.close()
    assert UnavailableGpuSampler("no driver").reason == "no driver"


def test_py_spy_frames_put_the_cause_they_point_at_first_with_the_frame_as_evidence() -> None:
    dump = (
        "Process 42: python3 -m sglang.launch_server --speculative-draft-model-path /m/draft\n"
        "Python v3.12.3 (/usr/bin/python3.12)\n\n"
        'Thread 42 (idle): "MainThread"\n'
        "    all_reduce (torch/distributed/distributed_c10d.py:2501)\n"
        "    load_model (sglang/srt/model_executor/model_runner.py:1290)\n"
    )
    causes = dx.causes_for("shards-loaded", stacks=[dump])
    assert "NCCL collective" in causes[0].cause and causes[0].evidence
    notes = dx.evidence_notes("shards-loaded", [dump])
    assert notes == [
        f"py-spy points at: {causes[0].cause} (frame: all_reduce (torch/distributed/distributed_c10d.py:2501))"
    ]
    # the process line (its command line) is no frame: the draft flag there points at no draft cause
    draft = dx.evidence_notes("draft-loading-weights", [dump])
    assert len(draft) == 1 and "collective" in draft[0]
    assert dx.causes_for("shards-loaded")[0].cause.startswith("kernels for this GPU missing")
