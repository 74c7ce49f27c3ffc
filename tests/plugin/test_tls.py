"""An https endpoint whose certificate comes from a private authority: one line that says so
and names SSL_CERT_FILE; with SSL_CERT_FILE pointing at the authority's certificate the
connection is trusted (what the server answers next is its own business). A proxy set in the
environment is said in the header and not used."""

import shutil
import ssl
import subprocess
import threading

import pytest
from aiohttp import web

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")


@pytest.fixture
def https_server(tmp_path):
    """A loopback https server (a self-signed certificate for 127.0.0.1) answering 503."""
    cert, key = tmp_path / "ca.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def busy(request: web.Request) -> web.Response:
        return web.Response(status=503, text="busy")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", busy)
    runner = web.AppRunner(app)
    import asyncio

    loop = asyncio.new_event_loop()
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{port}", cert
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


def test_a_private_authority_is_named_with_what_to_do(pytester, https_server, monkeypatch):
    url, cert = https_server
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    result = pytester.runpytest_subprocess(f"--llm-endpoint={url}", "--llm-timeout=5")
    assert result.ret != 0
    text = result.stdout.str() + result.stderr.str()
    assert "does not trust" in text and "SSL_CERT_FILE" in text, text
    assert "Traceback" not in text
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    result = pytester.runpytest_subprocess(f"--llm-endpoint={url}", "--llm-timeout=5")
    text = result.stdout.str() + result.stderr.str()
    assert "does not trust" not in text and "HTTP 503" in text, text


def test_a_proxy_in_the_environment_is_said_and_not_used(pytester, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # nothing listens: unused
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=10", "--llm-contexts=1K", "--llm-concurrency=1",
        "--llm-duration=1", "-m", "decode",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["llmspeed: HTTPS_PROXY set and not used: *directly*"])
