"""The recipe's install target and the registry helpers `invoke pins` relies on."""

from __future__ import annotations

import socket

import pytest

from bwstack.errors import RecipeError
from bwstack.recipes.registry import index_urls, reachable, target_for
from tests.released import released_wheel


def test_ubuntu_24_04_python_3_12_accepts_the_released_wheels_and_nothing_foreign() -> None:
    target = target_for("3.12", "13.1.0-devel-ubuntu24.04", where="r")
    assert target.platforms[0] == "manylinux_2_39_x86_64" and "manylinux2014_x86_64" in target.platforms
    assert target.accepts(released_wheel("sglang", "0.5.23").name)
    assert target.accepts(released_wheel("sglang-kernel", "0.4.10").name)
    assert not target.accepts("sglang-0.5.23-cp312-cp312-manylinux_2_34_aarch64.whl")
    assert not target.accepts("sglang-0.5.23-cp313-cp313-manylinux_2_34_x86_64.whl")
    assert not target.accepts("x-1-cp312-cp312-manylinux_2_40_x86_64.whl")  # needs a newer glibc
    assert target_for("3.12", "12.8.1-devel-ubuntu22.04", where="r").glibc == (2, 35)


def test_an_unknown_base_distribution_is_refused_naming_the_field() -> None:
    with pytest.raises(RecipeError, match=r"r: field base\.tag: cannot tell the glibc of 'latest'"):
        target_for("3.12", "latest", where="r")


def test_index_urls_are_the_remote_ones_pip_searched() -> None:
    output = "Looking in indexes: https://u:****@mirror.example/simple, file:///opt/pypi/simple\nCollecting x\n"
    assert index_urls(output) == ["https://u:****@mirror.example/simple"]


def test_reachable_is_false_for_a_closed_port_and_true_for_any_http_answer() -> None:
    import http.server
    import threading

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    assert not reachable(f"http://127.0.0.1:{closed}/simple", "sglang")
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # answers 501
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert reachable(f"http://user:****@127.0.0.1:{server.server_port}/simple", "sglang")
    finally:
        server.shutdown()
        server.server_close()
