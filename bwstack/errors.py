"""Typed errors. Library code raises these; only tasks.py turns them into exit codes.

Every BwstackError means "bad input or infrastructure" (exit 2). Its message is one line
that names the thing at fault and, where one exists, the remedy.
"""

from __future__ import annotations


class BwstackError(Exception):
    """Bad input or broken infrastructure: the task exits 2 with this one-line message."""

    def __init__(self, message: str, *, remedy: str | None = None) -> None:
        self.message = " ".join(message.split())
        self.remedy = remedy
        super().__init__(self.one_line())

    def one_line(self) -> str:
        return f"{self.message} (remedy: {self.remedy})" if self.remedy else self.message


class RecipeError(BwstackError):
    """A recipe file is missing, malformed, or asks for something its toolkit cannot do."""


class ArchError(BwstackError):
    """An architecture name that no table row matches."""


class RenderError(BwstackError):
    """A template failed to render (an undefined variable, a missing partial)."""


class FatbinError(BwstackError):
    """A CUDA binary whose ELF or fatbin structure cannot be read."""


class SourceError(BwstackError):
    """A wheel, folder or image that cannot be read as a source of binaries."""


class LoaderProbeError(BwstackError):
    """A package's own loader that could not be run or misbehaved."""


class DockerError(BwstackError):
    """The Docker engine is unreachable or refused a request."""


class SmokeError(BwstackError):
    """A smoke test that could not start (port busy, bad command, missing model)."""


class PreflightError(BwstackError):
    """A node or model check that could not run at all."""


class ReportError(BwstackError):
    """A report that could not be written where it was asked to go."""


class BenchError(BwstackError):
    """A bench or spec-check that could not run at all (bad flags, a server that never became ready)."""


class RegistryError(BwstackError):
    """The package registry could not be reached or did not answer as pip expects."""
