"""The page as a person sees it: a real browser (headless Chromium, Debian's package, installed
by the test set-up like vLLM) opens the file the plugin wrote. No request may leave the page,
the console must stay quiet, every section must be there and the charts drawn; screenshots
(desktop and phone widths) are written to ``out/`` next to the other test results."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "out"
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
QUIET = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def chromium(tmp_path, *args):
    if BROWSER is None:
        pytest.skip("no chromium: the set-up (scripts/setup_browser.py) could not install it")
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run(
        [BROWSER, *QUIET, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A run of the plugin on the simulator that writes its page (with a comparison)."""
    work = tmp_path_factory.mktemp("page")
    common = [
        "-p",
        "no:cacheprovider",
        "--llm-contexts=1K,4K",
        "--llm-concurrency=1,4,64",
        "--llm-duration=1",
        "--llm-max-output=128",
        "--llm-kv-capacity=100000",
        "-W",
        "ignore",
    ]
    env_run = {"cwd": work, "capture_output": True, "text": True, "timeout": 300}
    first = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--llm-endpoint=sim:tiny?speed=4",
            "--llm-results=old.json",
            *common,
        ],
        **env_run,
    )
    assert first.returncode == 0, first.stdout[-2000:]
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            # 10 % slower, and at most 32 requests running: the c64 cells say why they changed
            "--llm-endpoint=sim:tiny?speed=3.6&max_num_seqs=32",
            "--llm-results=new.json",
            "--llm-html=out/page.html",
            "--llm-compare=old.json",
            "--llm-meta",
            'hardware="2-core CPU (simulated GPU)"',
            "--llm-meta",
            "build=dev",
            # the bandwidth bound's inputs, and objectives every measured cell meets
            "--llm-meta",
            "weight_bytes=1GB",
            "--llm-meta",
            "kv_bytes_per_token=16KiB",
            "--llm-meta",
            "peak_bandwidth=100TB/s",
            "--llm-slo=ttft_p90<=10s",
            "--llm-launch-command=python -m pytest_llmspeed.sim --api-key sk-do-not-show",
            *common,
        ],
        **env_run,
    )
    assert second.returncode == 0, second.stdout[-2000:]
    return work / "out" / "page.html"


def plugin_page(tmp_path, *args):
    """Run the plugin on the simulator with ``args`` in a folder of its own, its page written;
    the DOM of the page as headless Chromium loads it, the console's lines, and the URLs it
    asked for (:func:`open_page`)."""
    work = tmp_path / "run"
    work.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore", *args,
         "--llm-html=page.html"],
        cwd=work, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:]
    return open_page(tmp_path, (work / "page.html").as_uri())


def open_page(tmp_path, uri):
    """The DOM after load, the console's lines, and the URLs the page itself asked for: in the
    net log, requests made for a file:// page carry its network isolation key; the browser's
    own background requests (sign-in, time) carry another."""
    netlog = tmp_path / f"net-{len(list(tmp_path.iterdir()))}.json"
    run = chromium(
        tmp_path, f"--log-net-log={netlog}", "--enable-logging=stderr", "--v=0", "--dump-dom", uri
    )
    console = [ln for ln in run.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    asked = set()
    for event in json.loads(netlog.read_text() or "{}").get("events", []):
        params = event.get("params") or {}
        url = params.get("url")
        page_made = str(params.get("network_isolation_key", "")).startswith("file://")
        if url and page_made and not url.startswith(("file://", "data:")):
            asked.add(url)
    return run.stdout, console, asked


def test_the_check_sees_a_request_and_a_console_error(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text('<img src="http://127.0.0.1:9/x.png"><script>console.error("boom")</script>')
    _, console, asked = open_page(tmp_path, bad.as_uri())
    assert asked == {"http://127.0.0.1:9/x.png"}
    assert any("boom" in line for line in console)


def test_page_opens_offline_with_every_section_and_drawn_charts(page, tmp_path):
    dom, console, asked = open_page(tmp_path, page.as_uri())
    for section in ("title", "metadata", "launch", "comparison", "why", "prefill", "decode",
                    "charts", "measurements", "server-figures"):  # fmt: skip
        assert f'id="{section}"' in dom, section
    # why the c64 cell changed, from the server's own figures (a finding whatever the noise;
    # 4K × 64 is over the capacity given)
    assert "decode[1K-c64] " in dom and "at most 32 of 64 requests running (was 64)" in dom
    # capacity at the objectives, a mark per cell, and the share of the bandwidth bound
    assert 'id="capacity"' in dom and "1K: 64 requests" in dom
    assert "4K: 4 requests (64 over capacity)" in dom and "SLO ✓" in dom
    assert "<th>share of the bandwidth bound</th>" in dom
    assert dom.count('<svg class="chart"') == 5
    assert dom.count('class="mark"') >= 10 and "<polyline" in dom
    assert "sk-do-not-show" not in page.read_text() and "--api-key &lt;redacted&gt;" in dom
    assert console == []
    assert asked == set()
    assert page.stat().st_size < 1_000_000


@pytest.mark.parametrize(("name", "size"), [("page", "1280,3200"), ("page-phone", "390,3200")])
def test_screenshots(page, tmp_path, name, size):
    SHOTS.mkdir(exist_ok=True)
    shot = SHOTS / f"{name}.png"
    run = chromium(tmp_path, f"--window-size={size}", f"--screenshot={shot}", page.as_uri())
    assert shot.is_file() and shot.stat().st_size > 20_000, run.stderr[-1000:]


#: the demo's matrix: 6 contexts × 8 concurrencies, 16 of them over capacity
DEMO_OVER = {(8, 128), (16, 128), (32, 64), (32, 128)} | {
    (k, n)
    for k, first in ((64, 32), (128, 16), (256, 8))
    for n in (8, 16, 32, 64, 128)
    if n >= first
}


def test_the_comparison_of_the_demo_matrix_fits_a_1280_px_window(tmp_path):
    from pytest_llmspeed.report.compare import compare
    from pytest_llmspeed.report.page import render_page
    from tests.unit.test_compare import matrix

    grid = (8, 16, 32, 64, 128, 256)
    old = matrix(DEMO_OVER, set(), grid)
    new = matrix(DEMO_OVER, set(), grid, speed=0.9)  # a change in every measured cell
    html = render_page(new, compare(old, new)).html
    assert html.count(">over capacity</td>") == 16
    measure = (
        '<script>var s = document.querySelector("#comparison .scroll");'
        'document.body.dataset.fit = [s.scrollWidth, s.clientWidth].join(" ");</script>'
    )
    page = tmp_path / "compare.html"
    page.write_text(html.replace("</body>", measure + "</body>"))
    run = chromium(tmp_path, "--window-size=1280,2000", "--dump-dom", page.as_uri())
    width, room = map(int, run.stdout.split('data-fit="')[1].split('"')[0].split())
    assert width <= room, f"the comparison is {width} px wide in {room} px: it scrolls"
