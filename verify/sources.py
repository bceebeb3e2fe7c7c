"""Where binaries come from: a folder, a wheel, or a Docker image, all seen as one file tree.

Each source yields a `Tree`: a folder on disk holding the package's Python files (so its own loader
can be probed) and the CUDA binaries to read. Choices, and why:

- `--path`: the folder itself; nothing is copied.
- `--wheel`: Python files are extracted (small); each .so member is streamed in 1 MiB chunks to a
  temporary file only when it is read, then deleted, so disk use peaks at the largest one member and
  memory stays flat. A stored (uncompressed) member could be read in place, but wheels deflate .so
  files, and an ELF's section table sits at its end, so positioned reads need a seekable copy.
- `--image`: a container is created (never started) and its filesystem exported as a tar stream;
  only regular files are taken (the package's files and every .so under site-/dist-packages), each
  name checked: absolute names, `..` and anything that is not a regular file (links included) are
  refused and listed, so a hostile image cannot write outside the scratch folder.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from bwstack.docker_engine import connect, first_line
from bwstack.errors import DockerError, FatbinError, SourceError
from bwstack.reaper import Lifeline
from bwstack.verify import elf
from bwstack.verify.device_files import is_device_name, read_device_entries, read_device_file
from bwstack.verify.fatbin import FatbinEntry
from bwstack.verify.stream_capture import WindowMiss, capture
from bwstack.verify.wheel_limits import (
    INFLATE_ERRORS,
    MAX_TEXT_MEMBER,
    Limits,
    bounded_copy,
    check_member,
    check_space,
)

_CHUNK = 1 << 20
VERIFY_LABEL = "io.bwstack.verify"  # on the never-started container an image is exported from
_SHARED_OBJECT_SUFFIXES = (".so",)


def is_shared_object(name: str) -> bool:
    base = PurePosixPath(name).name
    return base.endswith(_SHARED_OBJECT_SUFFIXES) or ".so." in base


def is_binary_candidate(name: str) -> bool:
    """Read by name: shared objects and device-code files (.cubin, .fatbin, .ptx)."""
    return is_shared_object(name) or is_device_name(name)


def might_be_elf(name: str, size: int) -> bool:
    """Worth reading 4 bytes to see if it is an ELF (an executable, an object file): no text suffix."""
    return size >= 64 and PurePosixPath(name).suffix not in _TEXT_SUFFIXES and not is_binary_candidate(name)


_TEXT_SUFFIXES = frozenset(
    [
        ".py",
        ".pyi",
        ".pyc",
        ".pth",
        ".json",
        ".txt",
        ".md",
        ".rst",
        ".h",
        ".hpp",
        ".cuh",
        ".cu",
        ".c",
        ".cc",
        ".cpp",
        ".inc",
        ".toml",
        ".cfg",
        ".ini",
        ".yaml",
        ".yml",
        ".lock",
        ".typed",
        ".html",
        ".css",
        ".js",
        ".csv",
        ".sh",
        ".cmake",
        ".in",
        ".jinja",
        ".j2",
        ".pxd",
        ".pyx",
        ".proto",
        ".def",
    ]
)
CUDA_RUNTIME = re.compile(r"libcudart\.so\.\d+\.\d+\.\d+")
_SMALL_MEMBER = 4 << 20  # members up to this size (cubins, small PTX) are read into memory whole


def safe_member_name(name: str) -> PurePosixPath | None:
    """A relative path with no `..` and no absolute root, or None for a name that must be refused."""
    path = PurePosixPath(name)
    if path.is_absolute() or not path.parts or any(part == ".." for part in path.parts):
        return None
    parts = [p for p in path.parts if p not in ("", ".")]
    return PurePosixPath(*parts) if parts else None


@dataclass
class Tree:
    """A source laid out as files under `root`; `.so` members may be materialised lazily."""

    label: str
    root: Path
    binaries: list[str]  # posix paths relative to root, sorted
    refused: list[str] = field(default_factory=list)  # members not taken, with the reason
    _wheel: zipfile.ZipFile | None = None
    limits: Limits = field(default_factory=Limits)

    def read(self, relative: str, *, kernels: bool = False) -> list[FatbinEntry]:
        """The device code entries of one file in the tree (FatbinError for a malformed one)."""
        if self._wheel is None:
            return read_device_file(self.root / relative, kernels=kernels)
        label = f"{self.label}!{relative}"
        if self._wheel.getinfo(relative).file_size <= _SMALL_MEMBER:
            # Read in bounded chunks: ZipFile.read() asks for the whole compressed size in one call, and a
            # lying header makes that a multi-GB allocation (found by fuzzing, as a MemoryError).
            buffer = io.BytesIO()
            info = self._wheel.getinfo(relative)
            try:
                with self._wheel.open(info) as member:
                    bounded_copy(member, buffer, info.file_size, self.limits, label, corrupt=FatbinError)
            except INFLATE_ERRORS as error:
                raise FatbinError(f"{label}: cannot decompress wheel member: {error}") from None
            return read_device_entries(elf.BytesSource(buffer.getvalue(), label), kernels=kernels)
        if not kernels:
            # One decompressing pass keeping only the header windows; rare layouts fall back to a copy.
            try:
                with self._wheel.open(relative) as member:
                    source = capture(member, self._wheel.getinfo(relative).file_size, label)
                return read_device_entries(source)
            except WindowMiss:
                pass
            except INFLATE_ERRORS as error:
                raise FatbinError(f"{label}: cannot decompress wheel member: {error}") from None
        # The fallback: one member on disk at a time, counted while it inflates, named by the member.
        info = self._wheel.getinfo(relative)
        check_space(Path(tempfile.gettempdir()), info.file_size, label)
        with tempfile.NamedTemporaryFile(prefix="bwstack-member-", suffix=".so") as copy:
            try:
                with self._wheel.open(info) as member:
                    bounded_copy(member, copy, info.file_size, self.limits, label, corrupt=FatbinError)
            except INFLATE_ERRORS as error:
                raise FatbinError(f"{label}: cannot decompress wheel member: {error}") from None
            copy.flush()
            return read_device_entries(elf.FileSource(copy.fileno(), label), kernels=kernels)

    def digest(self, relative: str) -> str:
        """sha256 of one file's bytes, streamed (to fold identical copies into one report row)."""
        sha = hashlib.sha256()
        try:
            with self.open(relative) as stream:
                while chunk := stream.read(_CHUNK):
                    sha.update(chunk)
        except INFLATE_ERRORS as error:
            raise FatbinError(f"{self.label}!{relative}: cannot be read: {error}") from None
        return sha.hexdigest()

    def open(self, relative: str) -> BinaryIO:
        """One file's bytes as a stream (a wheel member is decompressed as it is read)."""
        return self._wheel.open(relative) if self._wheel else (self.root / relative).open("rb")

    def size(self, relative: str) -> int:
        return self._wheel.getinfo(relative).file_size if self._wheel else (self.root / relative).stat().st_size


def _scan_binaries(root: Path, unreadable: list[str] | None = None) -> list[str]:
    """Regular files under root that may hold device code, links not followed; folders or files that cannot
    be read (`--path /` meets /proc) are noted in `unreadable` rather than ending the run."""
    found = []

    def note(error: OSError) -> None:
        if unreadable is not None:
            unreadable.append(f"{error.filename} (cannot be read: {error.strerror or error})")

    for folder, _dirs, files in os.walk(root, onerror=note):
        for name in files:
            path = Path(folder, name)
            try:
                info = path.lstat()
                if not stat.S_ISREG(info.st_mode):
                    continue
                if is_binary_candidate(name) or (might_be_elf(name, info.st_size) and _elf_head(path)):
                    found.append(path.relative_to(root).as_posix())
            except OSError as error:
                note(error)
    return sorted(found)


def _kind(path: Path) -> str | None:
    """What is at `path` when it is not what was asked for, in words; None for a missing path."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"unreadable ({error.strerror or error})"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a file" if stat.S_ISREG(mode) else "not a regular file"


@contextmanager
def open_path(folder: Path) -> Iterator[Tree]:
    folder = Path(folder)
    if not folder.is_dir():
        kind = _kind(folder)
        what = "does not exist" if kind is None else f"is {kind}, not a folder"
        raise SourceError(f"{folder}: {what}", remedy="pass --path a site-packages folder or a package folder")
    unreadable: list[str] = []
    binaries = _scan_binaries(folder, unreadable)
    yield Tree(str(folder), folder.resolve(), binaries, unreadable)


@contextmanager
def open_wheel(wheel: Path, limits: Limits | None = None) -> Iterator[Tree]:
    wheel, limits = Path(wheel), limits or Limits()
    if not wheel.is_file():
        kind = _kind(wheel)
        what = "wheel not found" if kind is None else f"is {kind}, not a wheel file"
        raise SourceError(f"{wheel}: {what}", remedy="pass --wheel a .whl file")
    try:
        archive = zipfile.ZipFile(wheel)
    # ValueError: negative offsets; NotImplementedError: a "version needed to extract" zipfile lacks
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as error:
        raise SourceError(f"{wheel}: not a readable wheel (zip): {error}") from None
    for info in archive.infolist():
        check_member(wheel, info, limits)
    with archive, tempfile.TemporaryDirectory(prefix="bwstack-wheel-") as scratch:
        root = Path(scratch)
        binaries, refused, extracted = [], [], 0
        for info in archive.infolist():
            if info.is_dir():
                continue
            name = safe_member_name(info.filename)
            if name is None:
                refused.append(f"{info.filename} (absolute or '..' path)")
                continue
            target = root / name
            wanted = name.suffix in (".py", ".pth", ".json", ".txt") or name.parent.name.endswith(".dist-info")
            try:
                if is_binary_candidate(name.name) or (
                    might_be_elf(name.name, info.file_size) and _member_is_elf(archive, info)
                ):
                    # A placeholder, so the loader probe sees the file exist; its bytes are streamed on read().
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.touch()
                    binaries.append(name.as_posix())
                elif wanted and info.file_size > MAX_TEXT_MEMBER:
                    refused.append(f"{info.filename} (claims {info.file_size} bytes; no Python file is that big)")
                elif wanted:
                    # Everything extracted stays until verify ends, so together it is held to one member's cap.
                    extracted += info.file_size
                    if extracted > limits.max_member:
                        raise SourceError(
                            f"{wheel}: its Python and metadata files inflate past the {limits.max_member}-byte cap",
                            remedy="raise the cap with --max-member-size if the wheel is trusted",
                        )
                    check_space(root, info.file_size, f"{wheel}!{info.filename}")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(info) as member, target.open("wb") as out:
                        bounded_copy(member, out, info.file_size, limits, f"{wheel}!{info.filename}")
            except (FileExistsError, NotADirectoryError, IsADirectoryError):
                refused.append(f"{info.filename} (clashes with another member: a file and a folder of one name)")
            except INFLATE_ERRORS as error:
                raise SourceError(f"{wheel}!{info.filename}: cannot extract: {error}") from None
        yield Tree(str(wheel), root.resolve(), sorted(binaries), refused, _wheel=archive, limits=limits)


@contextmanager
def open_image(
    ref: str, *, import_name: str, client: object | None = None, also: tuple[str, ...] = ()
) -> Iterator[Tree]:
    """Export an image's filesystem (without running it) and take the package and site-packages .so files,
    plus any file whose path ends with one of `also` (advise reads the image's ptxas binaries)."""
    import docker.errors

    client = connect(client)
    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise SourceError(f"image {ref!r} not found locally", remedy=f"docker pull {ref}, or build it first") from None
    except docker.errors.APIError as error:
        raise DockerError(f"image {ref!r}: {first_line(error)}") from None
    # A command is required to create a container from a FROM-scratch image with no CMD; it never runs.
    # Labelled, and watched by the reaper: if verify is killed outright, the container goes too.
    lifeline = Lifeline().__enter__()
    lifeline.watch_containers()
    try:
        container = client.containers.create(
            ref, command=["/bwstack-never-started"], network_disabled=True, labels=lifeline.labels(VERIFY_LABEL)
        )
    except BaseException:
        lifeline.close()
        raise
    try:
        with tempfile.TemporaryDirectory(prefix="bwstack-image-") as scratch:
            root = Path(scratch)
            refused = _extract_wanted(container.export(chunk_size=_CHUNK), root, import_name, also)
            yield Tree(f"image {ref}", root.resolve(), _scan_binaries(root), refused)
    finally:
        container.remove(force=True)
        lifeline.close()


def _wanted(name: PurePosixPath, import_name: str, also: tuple[str, ...] = ()) -> bool:
    if CUDA_RUNTIME.fullmatch(name.name):
        return True  # the CUDA runtime, wherever it is (its fully versioned file; the shorter names are links)
    parts = name.parts
    if import_name in parts[:-1]:
        return True  # the package's own files: loader, __init__, binaries
    if also and name.as_posix().endswith(also):
        return True  # files a caller asked for by their path's end (advise: the image's CUDA ptxas)
    if not any(p in ("site-packages", "dist-packages") for p in parts):
        return False
    # Device code anywhere in site-packages, the dist-info that names distributions, Triton's own ptxas.
    if name.parent.name.endswith(".dist-info"):
        return name.name in ("METADATA", "RECORD", "top_level.txt")
    return is_binary_candidate(name.name) or name.parent.name == "bin"


def _extract_wanted(chunks: Iterator[bytes], root: Path, import_name: str, also: tuple[str, ...] = ()) -> list[str]:
    refused: list[str] = []
    with tarfile.open(fileobj=io.BufferedReader(_ChunkStream(chunks), _CHUNK), mode="r|") as stream:
        for member in stream:
            name = safe_member_name(member.name)
            if name is None:
                refused.append(f"{member.name} (absolute or '..' path)")
                continue
            if not _wanted(name, import_name, also):
                continue
            if not member.isreg():
                if member.issym() or member.islnk():
                    refused.append(f"{member.name} (link to {member.linkname})")
                continue
            target = root / name
            source = stream.extractfile(member)
            if source is None:
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("wb") as out:
                    shutil.copyfileobj(source, out, _CHUNK)
            except (FileExistsError, NotADirectoryError, IsADirectoryError):
                refused.append(f"{member.name} (clashes with another member: a file and a folder of one name)")
    return refused


def _elf_head(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(4) == elf.ELF_MAGIC


def _member_is_elf(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    with archive.open(info) as member:
        return member.read(4) == elf.ELF_MAGIC


class _ChunkStream(io.RawIOBase):
    """The SDK's chunk iterator as a raw stream, for tarfile's streaming mode (no copying of buffers)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count
