"""The one report shape: a list of checks, rendered as a table, JSON or JUnit XML.

verify, build, smoke, preflight and provision all return a Report. Each check has a name, a
status, a one-line finding, evidence (numbers, paths, log lines) and, when it fails, a remedy.
A verb adds its own payload under `data` (targets, verdict, image id...); JSON puts that payload
at the top level beside `ok` and `checks` so CI can read e.g. `report["targets"]` directly.
"""

from __future__ import annotations

import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from bwstack import REPORT_SCHEMA_VERSION, __version__
from bwstack.errors import ReportError
from bwstack.inputs import REPORT_REMEDY, check_report_folder, writing
from bwstack.inputs import check_writable as check_writable  # where the task layer has always found it


class Status(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


# Characters XML 1.0 cannot carry, even escaped: C0 controls other than tab, newline and carriage return,
# and the non-characters U+FFFE and U+FFFF (valid UTF-8, so a server's log line can carry them).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _text(value: str) -> str:
    """Text safe to print or write as UTF-8 and XML: a finding may quote a broken file's bytes (a lone
    surrogate from invalid UTF-8, a NUL), which would otherwise crash the report at the last step."""
    clean = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", clean)


# Width for output that is not a terminal (a CI log, a pipe, a file): wide enough that rich never wraps a
# path or a finding, whose every character someone may need to copy.
_UNWRAPPED_WIDTH = 100_000


def table_console() -> Console:
    """A terminal's own width; anything else whole lines (rich would cut them at 80 columns), unless
    COLUMNS asks for a width."""
    if sys.stdout.isatty():
        return Console()
    columns = os.environ.get("COLUMNS", "")
    return Console(width=int(columns) if columns.isdigit() and int(columns) > 0 else _UNWRAPPED_WIDTH)


_STATUS_STYLE = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.SKIP: "dim"}


@dataclass
class Check:
    """One thing that was checked, and what was found."""

    name: str
    status: Status
    finding: str
    evidence: dict[str, Any] = field(default_factory=dict)
    remedy: str | None = None
    # A failure of the surroundings (daemon down, registry unreachable), not of the thing checked: exit 2.
    infrastructure: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": str(self.status),
            "finding": self.finding,
            "evidence": self.evidence,
            "remedy": self.remedy,
            "infrastructure": self.infrastructure,
        }


@dataclass
class Report:
    """The result of one verb on one subject (an image, a wheel, a server, a node)."""

    kind: str
    subject: str
    checks: list[Check] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(c.status is Status.FAIL for c in self.checks)

    @property
    def exit_code(self) -> int:
        """0 all passed, 1 a check failed, 2 the infrastructure failed (the check could not be made)."""
        if any(c.infrastructure for c in self.failures()):
            return 2
        return 0 if self.ok else 1

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status is Status.FAIL]

    def to_dict(self) -> dict[str, Any]:
        reserved = {"kind", "subject", "ok", "checks", "bwstack_version", "schema_version"}
        clash = reserved & self.data.keys()
        if clash:
            raise ValueError(f"report data may not use reserved keys {sorted(clash)}")
        return {
            "schema_version": REPORT_SCHEMA_VERSION,
            "bwstack_version": __version__,
            "kind": self.kind,
            "subject": self.subject,
            "ok": self.ok,
            "checks": [c.to_dict() for c in self.checks],
            **self.data,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, default=str) + "\n"

    def to_junit(self) -> str:
        """JUnit XML: one testsuite per report, one testcase per check."""
        suite = ET.Element(
            "testsuite",
            name=_text(f"bwstack.{self.kind}"),
            tests=str(len(self.checks)),
            failures=str(len(self.failures())),
            skipped=str(sum(c.status is Status.SKIP for c in self.checks)),
            errors="0",
        )
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="bwstack_version", value=__version__)
        for check in self.checks:
            case = ET.SubElement(suite, "testcase", classname=_text(f"bwstack.{self.kind}"), name=_text(check.name))
            body = json.dumps({"evidence": check.evidence, "remedy": check.remedy}, default=str)  # ASCII-escaped
            if check.status is Status.FAIL:
                failure = ET.SubElement(case, "failure", message=_text(check.finding))
                failure.text = body
            elif check.status is Status.SKIP:
                ET.SubElement(case, "skipped", message=_text(check.finding))
            else:
                out = ET.SubElement(case, "system-out")
                out.text = _text(f"{check.status}: {check.finding}")
        ET.indent(suite)
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"

    def write(self, *, json_path: str | Path | None = None, junit_path: str | Path | None = None) -> None:
        """Write the JSON and/or JUnit copies; a path that cannot be written is a ReportError (exit 2)."""
        for path, text in ((json_path, self.to_json), (junit_path, self.to_junit)):
            if path:
                target = Path(path)
                check_report_folder(target)  # never created: see check_writable
                with writing(f"the report to {target}", error=ReportError, remedy=REPORT_REMEDY):
                    target.write_text(text())

    def print_table(self, console: Console | None = None) -> None:
        console = console or table_console()
        title = Text(f"bwstack {self.kind}: {_text(self.subject)} ")
        title.append("PASS" if self.ok else "FAIL", style="green" if self.ok else "bold red")
        table = Table(title=title, show_lines=False, expand=False)
        table.add_column("check", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("finding")
        for check in self.checks:
            # Text, not markup: findings quote file, tensor and log text, where "[/b]" or ":smile:" is literal.
            finding = Text(_text(check.finding))
            if check.remedy and check.status in (Status.FAIL, Status.WARN):
                finding.append("\nremedy: ", style="cyan")
                finding.append(_text(check.remedy))
            table.add_row(Text(_text(check.name)), Text(str(check.status), style=_STATUS_STYLE[check.status]), finding)
        console.print(table)
