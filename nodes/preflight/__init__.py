"""Node preflight: is this node (driver, GPUs, interconnect, host) and this model folder ready to serve?

request = request_for_recipe("sglang", archs=["sm120"], model="/models/Kimi-K2.5")
report = run_preflight(request)          # a Report; report.data["gpus"][i]["cc"] == (12, 0)
"""

from bwstack.nodes.preflight.driver import DRIVER_FLOORS, judge_driver
from bwstack.nodes.preflight.model import DEFAULT_KV_HEADROOM, check_model
from bwstack.nodes.preflight.nvml import GpuFacts, NodeFacts, Nvml, NvmlUnavailable, read_node
from bwstack.nodes.preflight.run import PreflightRequest, node_ccs, request_for_recipe, run_preflight

__all__ = [
    "DEFAULT_KV_HEADROOM",
    "DRIVER_FLOORS",
    "GpuFacts",
    "NodeFacts",
    "Nvml",
    "NvmlUnavailable",
    "PreflightRequest",
    "check_model",
    "judge_driver",
    "node_ccs",
    "read_node",
    "request_for_recipe",
    "run_preflight",
]
