"""A loopback HTTP server in its own thread and event loop that hands every request, with a
client session of its own, to a handler: for routers and proxies in front of real servers."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
from aiohttp import web

Handler = Callable[[web.Request, aiohttp.ClientSession], Awaitable[web.StreamResponse]]


@contextlib.contextmanager
def forwarding_server(handler: Handler) -> Iterator[str]:
    """Yields the server's base URL while it runs; every route and method goes to ``handler``."""
    state: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> None:
        # A new upstream connection for every request: a server may close a kept-alive one
        # after answering (uvicorn does after an HTTP 500 from an exception, as transformers
        # serve's /v1/models offline), and a request sent on it then fails with a reset the
        # server never saw, which the proxy would pass on as the server's failure.
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=300),
        )

        async def route(request: web.Request) -> web.StreamResponse:
            return await handler(request, session)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", route)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # set by start()
        state["url"] = f"http://127.0.0.1:{port}"
        state["stop"] = asyncio.Event()
        state["loop"] = asyncio.get_running_loop()
        started.set()
        await state["stop"].wait()
        await session.close()
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the forwarding server did not start")
    try:
        yield state["url"]
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(30)
