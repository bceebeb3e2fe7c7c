"""The one Jinja2 environment factory: strict (a missing value is an error, never an empty string)."""

from __future__ import annotations

from pathlib import Path

import jinja2


def strict_environment(folder: Path) -> jinja2.Environment:
    """Templates under `folder`, StrictUndefined, trailing newline kept. No HTML escaping: every output is a
    Dockerfile, YAML or shell, and YAML scalars go through `tojson`, which YAML reads as-is."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
