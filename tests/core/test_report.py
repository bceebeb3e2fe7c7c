"""The shared report shape: exit codes, JSON, JUnit, and a table that prints whatever a finding quotes."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from bwstack.errors import ReportError
from bwstack.report import Check, Report, Status


def sample() -> Report:
    report = Report(kind="verify", subject="image [/b]x")
    report.add(Check("sm120 loader", Status.PASS, "runs via sm_120a"))
    report.add(
        Check("weights [/b]", Status.FAIL, "tensor model.[/b].weight is missing [red]", remedy="re-[/i]download")
    )
    report.add(Check("flash_ops", Status.WARN, "no code for 12.0"))
    report.add(Check("gpu", Status.SKIP, "no NVML"))
    report.data = {"targets": [{"arch": "sm120"}]}
    return report


def test_exit_codes_follow_the_worst_check() -> None:
    assert sample().exit_code == 1
    passing = Report("x", "y", [Check("a", Status.PASS, "ok"), Check("b", Status.WARN, "meh")])
    assert passing.exit_code == 0 and passing.ok
    infra = Report("x", "y", [Check("a", Status.FAIL, "registry down", infrastructure=True)])
    assert infra.exit_code == 2


def test_table_prints_findings_that_look_like_markup() -> None:
    buffer = io.StringIO()
    sample().print_table(Console(file=buffer, width=200, force_terminal=False))
    text = buffer.getvalue()
    assert "tensor model.[/b].weight is missing [red]" in text and "re-[/i]download" in text


def test_json_puts_the_payload_beside_ok_and_checks(tmp_path: Path) -> None:
    report = sample()
    report.write(json_path=tmp_path / "r.json", junit_path=tmp_path / "r.xml")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["ok"] is False and data["targets"] == [{"arch": "sm120"}]
    assert [c["status"] for c in data["checks"]] == ["pass", "fail", "warn", "skip"]
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "1")


def test_reserved_keys_cannot_be_shadowed_by_the_payload() -> None:
    report = sample()
    report.data["ok"] = True
    with pytest.raises(ValueError, match="reserved keys"):
        report.to_dict()


def test_unwritable_report_path_is_a_report_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReportError, match="cannot write the report to"):
        sample().write(json_path=blocker / "r.json")


def test_a_path_under_a_regular_file_says_so_not_file_exists(tmp_path: Path) -> None:
    from bwstack.report import check_writable

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReportError, match=f"{blocker} is a file, not a folder"):
        check_writable(blocker / "deeper" / "r.json")


def test_findings_quoting_broken_bytes_still_write_and_print(tmp_path: Path) -> None:
    """A lone surrogate (from invalid UTF-8) or a NUL in a finding must not crash the last step."""
    report = Report("preflight", "node")
    report.add(
        Check("model.config", Status.FAIL, "num_bits is '\ud800' in \x00config.json \ufffe", remedy="fix \ud800")
    )
    report.write(json_path=tmp_path / "r.json", junit_path=tmp_path / "r.xml")
    suite = ET.parse(tmp_path / "r.xml").getroot()  # well-formed XML
    assert "\\ud800" in suite.find("testcase/failure").get("message")
    assert json.loads((tmp_path / "r.json").read_text())["checks"][0]["status"] == "fail"
    import xml.dom.minidom

    xml.dom.minidom.parse(str(tmp_path / "r.xml"))  # the strictest parser at hand accepts it
    buffer = io.BytesIO()
    report.print_table(Console(file=io.TextIOWrapper(buffer, encoding="utf-8"), width=200, force_terminal=False))


def test_emoji_codes_in_findings_print_literally() -> None:
    buffer = io.StringIO()
    Report("smoke", "x", [Check("log", Status.WARN, "line says :smile: and [bold]")]).print_table(
        Console(file=buffer, width=200, force_terminal=False)
    )
    assert ":smile: and [bold]" in buffer.getvalue()


def test_an_unwritable_path_is_refused_up_front_and_a_writable_one_left_as_it_was(tmp_path: Path) -> None:
    from bwstack.report import check_writable

    with pytest.raises(ReportError, match=r"cannot write the report to /proc/x\.json"):
        check_writable("/proc/x.json")
    target = tmp_path / "reports" / "r.json"
    with pytest.raises(ReportError, match=r"folder .*/reports does not exist"):
        check_writable(target, None)
    assert not target.parent.exists()  # never created behind the user's back
    target.parent.mkdir()
    check_writable(target, None)
    assert not target.exists()
    target.write_text("kept")
    check_writable(target)
    assert target.read_text() == "kept"


def test_a_table_printed_to_a_pipe_keeps_every_path_and_finding_whole() -> None:
    """Not a terminal (a CI log): no 80-column cut, no wrapped path; each row is one line."""
    import os
    import subprocess
    import sys

    path = "/opt/venv/lib/python3.12/site-packages/sgl_kernel/sm100/common_ops.abi3.so" * 2
    program = (
        "from bwstack.report import Check, Report, Status\n"
        "r = Report(kind='verify', subject='image')\n"
        f"r.add(Check('sm120 loader', Status.FAIL, 'loads {path}: no sm_120 code', remedy='rebuild {path}'))\n"
        "r.print_table()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True, env=env).stdout
    assert any(f"loads {path}: no sm_120 code" in line for line in out.splitlines()), out
    assert any(f"remedy: rebuild {path}" in line for line in out.splitlines()), out
    assert max(len(line) for line in out.splitlines()) < 2 * len(path) + 100  # whole, not padded to the width
