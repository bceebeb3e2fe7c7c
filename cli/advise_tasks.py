"""advise: the SGLang command line and environment for this image, node and model, rule by rule."""

from __future__ import annotations

from bwstack.cli.program import Context, finish, guarded, task


def explain_text(name: str) -> str:
    """One rule of the table, in words: what it decides, the facts it reads, its source."""
    from bwstack.advise import AdviseError
    from bwstack.recipes.serving_rules import rule_named, rule_names

    rule = rule_named(name)
    if rule is None:
        raise AdviseError(f"no rule {name!r}; the rules are {', '.join(rule_names())}")
    lines = [
        f"rule:    {rule.name}",
        f"decides: {rule.decides}",
        f"reads:   {', '.join(rule.needs)}",
        f"source:  {rule.source}",
    ]
    if rule.better:
        lines.append(f"better:  {rule.better}")
    return "\n".join(lines)


@task(
    help={
        "image": "the local image that will serve: its Triton ptxas and flashinfer binaries are read (never run)",
        "path": "a folder (site-packages or an image's unpacked root) read instead of --image",
        "arch": "the GPU arch when this node has none to ask (NVML), e.g. sm120; other node facts stay unknown",
        "preflight": "a recorded `invoke preflight --json` report of the serving node (instead of asking NVML here)",
        "model": "checkpoint folder: architecture, quantization and weight bytes from its headers",
        "recipe": "recipe whose pinned SGLang and serve command are advised (default from invoke.yaml: sglang)",
        "port": "port in the printed command (default: the recipe's)",
        "explain": "print what one rule decides, the facts it reads and its source, then stop",
        "json": "write the advice (command, env, every rule's decision and the facts) as JSON to this file",
        "junit": "write the rule decisions as JUnit XML to this file",
    }
)
@guarded
def advise(
    c: Context,
    image: str | None = None,
    path: str | None = None,
    arch: str | None = None,
    preflight: str | None = None,
    model: str | None = None,
    recipe: str | None = None,
    port: str | None = None,
    explain: str | None = None,
    json: str | None = None,
    junit: str | None = None,
) -> None:
    """Print the SGLang command and environment for this image, node and model, with a rule | decision table."""
    from bwstack.cli.requests import advice_request
    from bwstack.nodes.advice import compute_advice

    if explain:
        print(explain_text(explain))
        return
    request = advice_request(
        c, image=image, path=path, arch=arch, preflight=preflight, model=model, recipe=recipe, port=port
    )
    _advice, report, _base = compute_advice(request)
    print(report.data["shell"])
    finish(report, json=json, junit=junit)
