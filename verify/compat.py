"""Which fatbin entry runs on which GPU: NVIDIA's rules (docs/facts.md section 2) as one table.

`runs_on(entry, cc)` answers for one entry; `best_runs(entries, cc)` for a whole binary, choosing
the way the driver does: any compatible cubin beats PTX, and PTX is JIT-compiled only when no cubin
fits. Family membership for `f` targets comes from recipes/archs.py, the one arch table.
LTO-IR never runs by itself: it must be linked (nvlink -dlto) into a cubin first, so no rule names it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from bwstack.recipes.archs import CC, arch_for_cc
from bwstack.verify.fatbin import FatbinEntry


class Runs(StrEnum):
    SASS = "sass"  # a cubin for this CC, or for a lower minor of the same major
    SASS_FAMILY = "sass-family"  # an `f` cubin whose family includes this CC
    PTX_JIT = "ptx-jit"  # PTX the driver compiles at first launch (slow, then cached)
    NONE = "none"


class Reach(StrEnum):
    """The set of compute capabilities a target's code can run on, relative to the target's own CC."""

    EXACT = "exact"  # only X.Y itself
    SAME_MAJOR = "same-major"  # X.Z for every Z >= Y
    FAMILY = "family"  # the CCs recipes/archs.py lists in family_runs_on
    ANY_NEWER = "any-newer"  # any CC >= X.Y, across majors


@dataclass(frozen=True)
class Rule:
    kind: str
    suffix: str
    reach: Reach
    runs: Runs
    why: str


RULES: tuple[Rule, ...] = (
    Rule("sass", "", Reach.SAME_MAJOR, Runs.SASS, "SASS runs on its CC and later minors of the same major"),
    Rule("sass", "a", Reach.EXACT, Runs.SASS, "arch-specific SASS runs only on exactly its CC"),
    Rule("sass", "f", Reach.FAMILY, Runs.SASS_FAMILY, "family SASS runs on the members of its family"),
    Rule("ptx", "", Reach.ANY_NEWER, Runs.PTX_JIT, "plain PTX is JIT-compiled for any CC at or above its own"),
    Rule("ptx", "a", Reach.EXACT, Runs.PTX_JIT, "arch-specific PTX compiles only for exactly its CC"),
    Rule("ptx", "f", Reach.FAMILY, Runs.PTX_JIT, "family PTX compiles only for the members of its family"),
)
_BY_TARGET = {(rule.kind, rule.suffix): rule for rule in RULES}


def rule_for(entry: FatbinEntry) -> Rule | None:
    """The rule that governs an entry; None for LTO-IR, which never runs on its own."""
    return _BY_TARGET.get((entry.kind, entry.suffix))


def runs_on(entry: FatbinEntry, cc: CC) -> Runs:
    """How (and whether) this one entry runs on a GPU of compute capability `cc`."""
    rule = rule_for(entry)
    if rule is None or not _reaches(rule.reach, entry.cc, cc):
        return Runs.NONE
    return rule.runs


def _reaches(reach: Reach, own: CC, cc: CC) -> bool:
    if reach is Reach.EXACT:
        return cc == own
    if reach is Reach.SAME_MAJOR:
        return cc[0] == own[0] and cc[1] >= own[1]
    if reach is Reach.ANY_NEWER:
        return cc >= own
    arch = arch_for_cc(own)
    # A family target the table does not know is trusted only on its own CC (every family holds itself).
    return cc in arch.family_runs_on if arch else cc == own


_SUFFIX_RANK = {"a": 2, "f": 1, "": 0}


def best_runs(entries: Iterable[FatbinEntry], cc: CC) -> tuple[Runs, FatbinEntry | None]:
    """How a binary runs on `cc`, and the entry the driver would use; (NONE, None) if nothing fits.

    A compatible cubin always wins over PTX. Among cubins the closest target is taken (highest arch
    number, then `a` over `f` over plain); among PTX the newest that fits, as the driver JITs the
    highest compatible PTX. Ties keep file order.
    """
    best: tuple[tuple[int, int, int], Runs, FatbinEntry] | None = None
    for entry in entries:
        runs = runs_on(entry, cc)
        if runs is Runs.NONE:
            continue
        key = (0 if runs is Runs.PTX_JIT else 1, entry.number, _SUFFIX_RANK[entry.suffix])
        if best is None or key > best[0]:
            best = (key, runs, entry)
    return (best[1], best[2]) if best else (Runs.NONE, None)
