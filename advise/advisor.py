"""Evaluate the rule table over the facts: the launch command, its environment, and one decision per rule.

A rule is "applied" (it fires and sets something), "not needed" (its facts rule it out), "not evaluated"
(a fact it needs is unknown), or "refused" (the facts say no launch can work: the advice is not usable).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from packaging.version import Version

from bwstack.advise.facts import AdviseError, Facts, read_json
from bwstack.recipes.recipe import Recipe
from bwstack.recipes.serving_rules import RULES, SUPPORTED_SGLANG, ServingRule, option_flag
from bwstack.report import Check, Report, Status

ADVICE_KIND = "advise"


class Decision(StrEnum):
    APPLIED = "applied"
    NOT_NEEDED = "not needed"
    NOT_EVALUATED = "not evaluated"
    REFUSED = "refused"


@dataclass(frozen=True)
class RuleDecision:
    rule: str
    decision: Decision
    why: str
    source: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    better: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "decision": str(self.decision),
            "why": self.why,
            "source": self.source,
            "args": list(self.args),
            "env": self.env,
            "better": self.better or None,
        }


def decide(rule: ServingRule, facts: dict[str, Any], version: str) -> RuleDecision:
    """One rule over the named facts, its options spelled for SGLang `version`."""
    missing = [name for name in rule.needs if facts.get(name) is None]
    if not missing:
        missing = [name for name in rule.more_needs(facts) if facts.get(name) is None]
    if missing:
        return RuleDecision(
            rule.name, Decision.NOT_EVALUATED, f"unknown: {', '.join(missing)}", rule.source, better=rule.better
        )
    why = rule.why(facts)
    refusal = rule.refuse(facts)
    if refusal:
        return RuleDecision(rule.name, Decision.REFUSED, refusal, rule.source, better=rule.better)
    if not rule.applies(facts):
        return RuleDecision(rule.name, Decision.NOT_NEEDED, why, rule.source)
    emit = rule.emit(facts)
    args: list[str] = []
    for key, value in emit.args:
        args += [option_flag(key, version)] + ([value] if value is not None else [])
    return RuleDecision(rule.name, Decision.APPLIED, why, rule.source, tuple(args), dict(emit.env), rule.better)


@dataclass(frozen=True)
class Advice:
    """The launch for one recipe, node, model and image: base command + advised options + environment."""

    recipe: str
    sglang_version: str
    decisions: tuple[RuleDecision, ...]
    facts: dict[str, Any]

    @property
    def refused(self) -> list[RuleDecision]:
        return [d for d in self.decisions if d.decision is Decision.REFUSED]

    @property
    def args(self) -> tuple[str, ...]:
        return tuple(a for d in self.decisions if d.decision is Decision.APPLIED for a in d.args)

    @property
    def env(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        for d in self.decisions:
            if d.decision is Decision.APPLIED:
                merged.update(d.env)
        return merged

    def command(self, base: list[str]) -> list[str]:
        return list(base) + list(self.args)

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "sglang_version": self.sglang_version,
            "args": list(self.args),
            "env": self.env,
            "refused": [d.rule for d in self.refused],
            "decisions": [d.to_dict() for d in self.decisions],
            "facts": _jsonable(self.facts),
        }


def advise(recipe: Recipe, facts: Facts) -> Advice:
    """Every rule of the table over these facts, for the recipe's pinned SGLang."""
    if recipe.serve.engine != "sglang":
        raise AdviseError(f"recipe {recipe.name}: advice exists for the sglang engine, not {recipe.serve.engine!r}")
    if recipe.sglang is None:
        raise AdviseError(f"recipe {recipe.name}: no [sglang] version pinned; the advice depends on it")
    version = recipe.sglang.version
    if Version(version) not in SUPPORTED_SGLANG:
        raise AdviseError(
            f"recipe {recipe.name}: SGLang {version} is older than the advisor's rules support ({SUPPORTED_SGLANG})"
        )
    named = facts.named()
    decisions = tuple(decide(rule, named, version) for rule in RULES)
    return Advice(recipe.name, version, decisions, named)


_STATUS = {
    Decision.APPLIED: Status.PASS,
    Decision.NOT_NEEDED: Status.PASS,
    Decision.NOT_EVALUATED: Status.SKIP,
    Decision.REFUSED: Status.FAIL,
}


def advice_report(advice: Advice, base_command: list[str], subject: str) -> Report:
    """The advice as a Report: one check per rule (decision | why | source), the command and env as data."""
    report = Report(kind=ADVICE_KIND, subject=subject)
    for d in advice.decisions:
        sets = " ".join([f"{k}={v}" for k, v in d.env.items()] + list(d.args))
        finding = f"{d.decision}: {d.why}" + (f" -> {sets}" if sets else "") + f" [source: {d.source}]"
        evidence = {"source": d.source, "args": list(d.args), "env": d.env}
        report.add(Check(d.rule, _STATUS[d.decision], finding, evidence, remedy=d.better or None))
    command = advice.command(base_command)
    report.data = {
        "advice": advice.to_dict(),
        "command": command,
        "shell": " ".join([f"{k}={shlex.quote(v)}" for k, v in advice.env.items()] + [shlex.join(command)]),
    }
    return report


def load_advice(path: Path) -> dict[str, Any]:
    """An advice file (`invoke advise --json F`): its args and env, checked; AdviseError otherwise."""
    data = read_json(path, "advice")
    advice = data.get("advice") if data.get("kind") == ADVICE_KIND else None
    if not isinstance(advice, dict):
        raise AdviseError(f"advice {path}: not an `invoke advise --json` report")
    args, env = advice.get("args"), advice.get("env")
    if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        raise AdviseError(f"advice {path}: args is not a list of strings")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise AdviseError(f"advice {path}: env is not a table of strings")
    if advice.get("refused"):
        raise AdviseError(
            f"advice {path}: refused by rule {', '.join(advice['refused'])}: the launch cannot work on this node"
        )
    return advice


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
