"""pytest plugin: a real vLLM (CPU build) server for tests marked ``vllm``.

List it in a conftest: ``pytest_plugins = ["tests.vllm_server"]`` (or run pytest with
``-p tests.vllm_server``). It gives the session-scoped fixture ``vllm_server``, a callable::

    def test_x(vllm_server):
        server = vllm_server()                    # stream_interval=1
        chunky = vllm_server(stream_interval=4)   # a second server, up to 4 tokens per SSE chunk
        locked = vllm_server(api_key="secret")    # a third, started with --api-key secret

Each distinct argument set starts one server, once per session, and every server's whole process
group is stopped at the end of the session. The servers are ``engines.servers.Servers``, which
the benchmarks use too: the virtualenv and the tiny random-weight model that
``scripts/setup_vllm.py`` writes under ``$LLMSPEED_VLLM_HOME`` (default
``~/.cache/pytest-llmspeed/vllm``); nothing is downloaded. When that set-up is missing, or a
server does not start, the fixture fails the test (it never skips): CI must notice a missing
vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from engines.servers import Servers, StartError, VllmServer


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., VllmServer]]:
    """Factory: ``vllm_server(stream_interval=1, *, api_key=None) -> VllmServer``.

    One server per distinct argument set, started on first use and kept for the session.
    """
    servers = Servers(tmp_path_factory.mktemp("vllm"))

    def server(stream_interval: int = 1, *, api_key: str | None = None) -> VllmServer:
        try:
            return servers.get(stream_interval, api_key=api_key)
        except StartError as exc:
            pytest.fail(str(exc), pytrace=False)

    try:
        yield server
    finally:
        servers.stop_all()
