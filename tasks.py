"""bwstack's front door in a checkout: `invoke <task>`. The tasks live in the installed package (bwstack.cli),
which the `bwstack` console script serves too."""

from bwstack.cli import namespace as ns

__all__ = ["ns"]
