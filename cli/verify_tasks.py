"""verify: does the binary a package's loader picks run on each GPU?"""

from __future__ import annotations

from bwstack.cli.clean_tasks import report_stale
from bwstack.cli.program import Context, finish, guarded, task


@task(
    iterable=["arch", "require", "allow_missing"],
    help={
        "arch": "GPU arch(s) to check: sm120, sm_121, 12.0; repeat or use commas; all = every arch bwstack knows",
        "wheel": "a wheel file to verify (.so members are streamed, never unpacked all at once)",
        "path": "a folder to verify: site-packages, or the package folder itself",
        "image": "a local Docker image to verify (its filesystem is exported; the image is never run)",
        "package": "import name of the package whose loader picks the binary (default: sgl_kernel); dotted "
        "and namespace packages work (nvidia.cu13)",
        "require": "another binary that must run too (repeatable), e.g. flash_ops; others only warn",
        "kernels": "also list kernel names in every cubin, and name the kernels without code per GPU",
        "allow_partial": "containers (translation units) with no code for a GPU only warn, even in the binary the "
        "loader picks",
        "allow_missing": "kernel-name glob (repeatable): containers with no code for a GPU only warn when all their "
        "kernels match, e.g. '*sm100*' for arch-specific kernels that are absent by design (reads kernel names)",
        "cuda": "the CUDA version (major.minor) the stack was built for: checks the CUDA runtime in the source",
        "json": "write the report as JSON to this file",
        "junit": "write the report as JUnit XML to this file",
        "timeout": "seconds the package's loader may take per arch before it counts as hung (default 30)",
        "max_member_size": "largest a wheel member may inflate to, e.g. 8G (default 4G); bigger ones are refused",
    },
)
@guarded
def verify(
    c: Context,
    arch: list[str],
    wheel: str | None = None,
    path: str | None = None,
    image: str | None = None,
    package: str = "sgl_kernel",
    require: list[str] | None = None,
    kernels: bool = False,
    allow_partial: bool = False,
    allow_missing: list[str] | None = None,
    cuda: str | None = None,
    json: str | None = None,
    junit: str | None = None,
    timeout: str = "30",
    max_member_size: str = "4G",
) -> None:
    """Check that the binary a package's loader picks has code for each GPU arch (exit 1 if not)."""
    from bwstack.cli.requests import verify_options
    from bwstack.verify.verify import open_source, verify_tree

    options = verify_options(arch, require, timeout, max_member_size)
    report_stale("verify", containers=bool(image))
    with open_source(wheel=wheel, path=path, image=image, import_name=package, limits=options.limits) as tree:
        report = verify_tree(
            tree,
            options.archs,
            import_name=package,
            require=require or [],
            kernels=kernels,
            allow_partial=allow_partial,
            allow_missing=allow_missing or [],
            cuda=cuda,
            probe_timeout=options.probe_timeout_s,
        )
    finish(report, json=json, junit=junit)
