"""Which installed distribution (name and version) provides an import package.

The import name is not the project: `sgl_kernel` is installed by both sgl-kernel (0.3.x) and
sglang-kernel (0.4.x), so a remedy must name the distribution that is actually there. It comes from
the `*.dist-info` folder whose RECORD (or top_level.txt) lists the package, and its METADATA; a
wheel without one (or one not read) is named by the wheel file name (`name-version-tags.whl`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
_MAX_METADATA = 1 << 20


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    files: frozenset[str] = field(default=frozenset(), compare=False, repr=False)  # RECORD paths

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


def find_distributions(site: Path, import_name: str) -> list[Distribution]:
    """Every dist-info directly in `site` that installs `import_name` (normally one)."""
    top = import_name.split(".")[0]
    found = []
    for info in sorted(site.glob("*.dist-info")):
        if _installs(info, top, import_name) and (dist := _metadata(info)):
            found.append(Distribution(dist.name, dist.version, _record(info)))
    return found


def from_wheel_name(filename: str) -> Distribution | None:
    match = _WHEEL_NAME.match(PurePosixPath(filename).name)
    if not match:
        return None
    return Distribution(match.group("name").replace("_", "-"), match.group("version"))


def _installs(info: Path, top: str, import_name: str) -> bool:
    top_level = info / "top_level.txt"
    if top_level.is_file() and top in top_level.read_text(errors="replace").split():
        return True
    record = info / "RECORD"
    if not record.is_file():
        return False
    prefix = import_name.replace(".", "/") + "/"
    with record.open(errors="replace") as lines:
        return any(line.startswith(prefix) for line in lines)


def _metadata(info: Path) -> Distribution | None:
    path = info / "METADATA"
    if not path.is_file():
        return None
    with path.open(errors="replace") as file:
        headers = HeaderParser().parsestr(file.read(_MAX_METADATA), headersonly=True)
    name, version = headers.get("Name"), headers.get("Version")
    return Distribution(name.strip(), version.strip()) if name and version else None


def _record(info: Path) -> frozenset[str]:
    record = info / "RECORD"
    if not record.is_file():
        return frozenset()
    with record.open(errors="replace") as lines:
        return frozenset(line.split(",", 1)[0] for line in lines if line.strip())
