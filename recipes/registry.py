"""What the package registry says about a released wheel, read for a recipe's Python and platform.

pip does the finding: it is the one program that already honours everything a user configures
(PIP_INDEX_URL, extra indexes, find-links, certificates, proxies, keyring). The index here serves no
PEP 658 metadata files, so any pip-based read downloads the wheel anyway; `pip download --no-deps` puts
it in the same cache scripts/prefetch.py fills, once per release, and the METADATA is read from the
zip. A wheel already in the cache is read without asking the registry at all.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from bwstack.errors import RecipeError, RegistryError

# glibc of the base images recipes use: a wheel tagged manylinux_2_X runs where glibc >= 2.X.
BASE_GLIBC: dict[str, tuple[int, int]] = {"ubuntu20.04": (2, 31), "ubuntu22.04": (2, 35), "ubuntu24.04": (2, 39)}
# The legacy manylinux names and the glibc they stand for (PEP 600).
LEGACY_MANYLINUX = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}
PIP_TIMEOUT_S = 900  # a 400 MB kernel wheel on a slow link
PROBE_TIMEOUT_S = 10


def cache_dir() -> Path:
    """The released-wheel cache scripts/prefetch.py fills ($BWSTACK_CACHE, default ~/.cache/bwstack/wheels)."""
    return Path(os.environ.get("BWSTACK_CACHE", Path.home() / ".cache" / "bwstack" / "wheels"))


@dataclass(frozen=True)
class Target:
    """The interpreter and platform a recipe's image installs wheels for."""

    python: str  # "3.12"
    glibc: tuple[int, int]
    machine: str = "x86_64"

    @property
    def platforms(self) -> list[str]:
        """pip's --platform values, newest first: pip does not widen manylinux_2_39 to older glibcs itself."""
        major, minor = self.glibc
        tags = [f"manylinux_{major}_{m}_{self.machine}" for m in range(minor, 4, -1)]
        return tags + [f"{name}_{self.machine}" for name, floor in LEGACY_MANYLINUX.items() if floor <= self.glibc]

    @property
    def label(self) -> str:
        return f"cp{self.python.replace('.', '')} manylinux_{self.glibc[0]}_{self.glibc[1]}_{self.machine}"

    def tags(self) -> set[Tag]:
        version = tuple(int(p) for p in self.python.split("."))
        return set(cpython_tags(version, platforms=self.platforms)) | set(
            compatible_tags(version, f"cp{version[0]}{version[1]}", platforms=self.platforms)
        )

    def accepts(self, filename: str) -> bool:
        try:
            _name, _version, _build, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            return False
        return bool(tags & self.tags())

    def marker_environment(self) -> dict[str, str]:
        return {
            "python_version": self.python,
            "python_full_version": f"{self.python}.0",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "os_name": "posix",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": self.machine,
            "extra": "",
        }


def target_for(python: str, base_tag: str, *, where: str) -> Target:
    """The target of a recipe: its [python] version and the glibc of its base image's distribution."""
    distro = base_tag.rsplit("-", 1)[-1]
    if distro not in BASE_GLIBC:
        known = ", ".join(BASE_GLIBC)
        raise RecipeError(f"{where}: field base.tag: cannot tell the glibc of {base_tag!r} (known: {known})")
    if not re.fullmatch(r"3\.\d+", python):
        raise RecipeError(f'{where}: field python.version: expected "3.N", got {python!r}')
    return Target(python, BASE_GLIBC[distro])


@dataclass(frozen=True)
class WheelMetadata:
    """The parts of a wheel's *.dist-info/METADATA that pins are checked against."""

    name: str
    version: str
    filename: str
    requires_python: str
    requires_dist: tuple[str, ...]
    project_urls: dict[str, str] = field(default_factory=dict)

    def requirement(self, name: str, target: Target) -> Requirement | None:
        """The Requires-Dist entry for `name` that applies on `target` (markers evaluated), if any."""
        wanted = canonicalize_name(name)
        for line in self.requires_dist:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            if canonicalize_name(requirement.name) != wanted:
                continue
            marker: Marker | None = requirement.marker
            if marker is None or marker.evaluate(target.marker_environment()):
                return requirement
        return None


def read_metadata(wheel: Path) -> WheelMetadata:
    """Parse *.dist-info/METADATA of a wheel file (only that member is inflated)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if len(members) != 1:
                raise RegistryError(f"{wheel}: expected one *.dist-info/METADATA, found {len(members)}")
            text = archive.read(members[0]).decode("utf-8")
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError) as error:
        raise RegistryError(f"{wheel}: cannot read the wheel's metadata: {error}") from None
    headers = HeaderParser().parsestr(text, headersonly=True)
    urls = {}
    for entry in headers.get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        urls[label.strip()] = url.strip()
    return WheelMetadata(
        name=str(headers.get("Name", "")),
        version=str(headers.get("Version", "")),
        filename=wheel.name,
        requires_python=str(headers.get("Requires-Python", "")),
        requires_dist=tuple(str(v) for v in headers.get_all("Requires-Dist") or []),
        project_urls=urls,
    )


def cached_wheel(name: str, version: str, target: Target, folder: Path) -> Path | None:
    """A wheel of name==version in `folder` that installs on `target`."""
    if not folder.is_dir():
        return None
    prefix = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"
    found = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix) and target.accepts(p.name))
    return found[0] if found else None


@dataclass(frozen=True)
class PipRegistry:
    """Callable as fetch(name, version): that release's metadata for the target, or None when the registry
    has no wheel of it for the target. RegistryError when the registry cannot be reached."""

    target: Target
    folder: Path
    refresh: bool = False  # ask the registry even for a cached release

    def __call__(self, name: str, version: str) -> WheelMetadata | None:
        if not self.refresh:
            found = cached_wheel(name, version, self.target, self.folder)
            if found:
                return read_metadata(found)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RegistryError(f"cannot create the wheel cache {self.folder}: {error.strerror}") from None
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar=off"]
        command += ["--python-version", self.target.python, "-d", str(self.folder)]
        for platform in self.target.platforms:
            command += ["--platform", platform]
        command.append(f"{name}=={version}")
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RegistryError(f"pip download {name}=={version} took over {PIP_TIMEOUT_S} s") from None
        if result.returncode == 0:
            found = cached_wheel(name, version, self.target, self.folder)
            if found:
                return read_metadata(found)
        output = result.stdout + result.stderr
        unreachable = [url for url in index_urls(output) if not reachable(url, name)]
        if unreachable:
            raise RegistryError(
                f"cannot reach the package index {unreachable[0]} to read {name}=={version}",
                remedy="check the network, PIP_INDEX_URL and `pip config list`",
            )
        if "No matching distribution found" in output:
            return None
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RegistryError(f"pip download {name}=={version} failed: {last}")


def index_urls(pip_output: str) -> list[str]:
    """The remote indexes pip says it searched ("Looking in indexes: a, b"): pip does not log why a page
    could not be fetched, so reachability is probed separately."""
    urls: list[str] = []
    for line in pip_output.splitlines():
        if line.startswith("Looking in indexes:"):
            urls += [u.strip() for u in line.split(":", 1)[1].split(",")]
    return [u for u in urls if u.startswith(("http://", "https://"))]


def reachable(index_url: str, name: str) -> bool:
    """Does the index answer at all? Any HTTP status (even 401 or 404) means it was reached."""
    parts = urllib.parse.urlsplit(index_url)
    # pip shows credentials masked (user:****@host): probe the host without them.
    netloc = parts.netloc.rsplit("@", 1)[-1]
    url = urllib.parse.urlunsplit(
        (parts.scheme, netloc, f"{parts.path.rstrip('/')}/{canonicalize_name(name)}/", "", "")
    )
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False
