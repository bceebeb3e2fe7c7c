"""What the fleet manifests say, and the names the renderer and the checks of its output share."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from bwstack.recipes.archs import CC, cc_text

DAEMONSET = "daemonset.yaml"
PLAYBOOK = "playbook.yml"
DEFAULT_RUNNER = "bwstack-runner:latest"
DEFAULT_REPORTS = "/var/lib/bwstack/reports"
DOCKER_SOCKET = "/var/run/docker.sock"
NO_DOCKER_LABEL = "bwstack/no-docker"  # label a node without Docker with it to keep the DaemonSet off it

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class FleetSpec:
    """Everything the fleet manifests say; built from a recipe by `spec_for_recipe`."""

    recipe: str
    arch: str  # "sm120"
    cc: CC
    cuda: str
    tp: int
    image: str  # the stack image provision verifies and smoke-tests
    model_dir: str  # the checkpoint folder, at the same path on every node
    runner_image: str = DEFAULT_RUNNER  # an image holding bwstack (repo + venv) that runs the checks
    namespace: str = "bwstack"
    report_dir: str = DEFAULT_REPORTS
    extra_labels: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"bwstack-{self.recipe}-{self.arch}"

    @property
    def cc_str(self) -> str:
        return cc_text(self.cc)

    @property
    def preflight_command(self) -> list[str]:
        return [
            "bwstack",
            "preflight",
            "--recipe",
            self.recipe,
            "--arch",
            self.arch,
            "--tp",
            str(self.tp),
            "--model",
            self.model_dir,
            "--json",
            f"{self.report_dir}/preflight.json",
        ]

    @property
    def provision_command(self) -> list[str]:
        return [
            "bwstack",
            "provision",
            "--image",
            self.image,
            "--model",
            self.model_dir,
            "--recipe",
            self.recipe,
            "--json",
            f"{self.report_dir}/provision.json",
        ]
