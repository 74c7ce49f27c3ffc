"""Several replicas of one model behind ``--llm-endpoint``: throughput, the spread of streams,
the capacity arithmetic per replica, replicas that differ, and ``--llm-metrics-url``."""

import contextlib
import dataclasses
import json

import pytest
from junitparser import JUnitXml

from pytest_llmspeed.sim import SimOptions, running_simulator, running_simulator_process
from pytest_llmspeed.sim.profiles import PROFILES

# c=4 at 1K with 128-token outputs needs 4 × 1,152 = 4,608 tokens of KV cache, c=8 9,216: with
# 8,192 tokens c=8 is over capacity on one replica and fits on two (4 streams each)
SMALL = "sim:tiny?speed=1&max_model_len=2048&kv_capacity=8192"


def _matrix(pytester, endpoint, *args):
    return pytester.runpytest(
        f"--llm-endpoint={endpoint}",
        "--llm-contexts=1K",
        "--llm-concurrency=4,8,15",
        "--llm-duration=1",
        "--llm-max-output=128",
        "--llm-results=out.json",
        "--junitxml=out.xml",
        "-rs",
        "-p",
        "no:benchmark",
        *args,
    )


def _decode(pytester):
    doc = json.loads((pytester.path / "out.json").read_text())
    return doc, {c["id"]: c for c in doc["cells"] if c["phase"] == "decode"}


@pytest.mark.slow
def test_two_replicas_give_twice_one_replicas_throughput_and_split_the_streams(pytester):
    """One replica runs c=4 and skips c=8 (over capacity); two run c=8 at about twice the
    throughput, 4 streams on each, and skip c=15 with the arithmetic per replica."""
    # The second run is gated against the first; its prefill[1K] is one cold request of ~11 ms
    # that a busy machine moved by 20 %: the median of 6 carries an interval, and the gate
    # judges the figure with its noise (docs/judge.md, "With intervals")
    one = _matrix(pytester, SMALL, "--llm-save-baseline=one.toml", "--llm-prefill-repeats=6")
    one.assert_outcomes(passed=2, skipped=2)
    one.stdout.fnmatch_lines(["*Over capacity: 8 × (1K + 128) = 9,216 > KV capacity 8,192*"])
    _, cells = _decode(pytester)
    single = cells["decode[1K-c4]"]
    assert "replica_tok_s" not in single  # one server: no per-replica figures

    # (gated at 30 %: the test is about the warning and the pair's cells, not a 5 % floor on a
    # busy machine's cold prefills)
    two = _matrix(
        pytester,
        f"{SMALL}&replicas=2",
        "--llm-baseline=one.toml",
        "--llm-prefill-repeats=6",
        "--llm-tolerance=30%",
    )
    two.assert_outcomes(passed=3, skipped=1)  # c=8: 4 per replica fits; c=15: 8 does not
    # two replicas' throughput is not comparable with one's: said (the floors of c=4 hold)
    two.stdout.fnmatch_lines(
        [
            "note: warning: baseline one.toml was taken with other settings: replicas 1 in the "
            "baseline, 2 now"
        ]
    )
    two.stdout.fnmatch_lines(
        [
            "llmspeed server: 2 replicas (http://127.0.0.1:*, http://127.0.0.1:*) · *"
            "KV capacity 8,192 tokens (server /metrics, per replica: the smallest of 2 replicas)",
            "  decode[[]1K-c8[]]: total * tok/s; per replica * · *",
            "*Over capacity: ceil(15 / 2 replicas) × (1K + 128) = 8 × 1,152 = 9,216 > "
            "KV capacity of one replica 8,192",
        ]
    )
    doc, cells = _decode(pytester)
    both = cells["decode[1K-c8]"]
    # each replica serves 4 streams, as the single one did: twice its throughput. A busy
    # machine moves a run's throughput by 20 % from one minute to the next (CI: 3,052 against
    # twice 1,931): the single replica is measured again after the pair, and the pair is
    # compared with the nearer of the two
    after = _matrix(
        pytester, SMALL, "--llm-prefill-repeats=6", "--llm-results=after.json",
        "--junitxml=after.xml",
    )  # fmt: skip
    after.assert_outcomes(passed=2, skipped=2)
    again = json.loads((pytester.path / "after.json").read_text())
    singles = [single["total_tok_s"], *(c["total_tok_s"] for c in again["cells"]
                                        if c["id"] == "decode[1K-c4]")]  # fmt: skip
    assert len(singles) == 2
    nearer = min(singles, key=lambda s: abs(both["total_tok_s"] - 2 * s))
    # Chance: "about twice" is a speed, and this machine's load moves speeds (CI: 1.58 ×, 3,052
    # against twice 1,931): the test asks only for clearly more than one replica and at most
    # a little over twice, bounds that hold from a quiet machine to that CI run and beyond; a
    # pair that served no more than one (the streams all sent to one replica) fails it
    assert 1.25 * nearer < both["total_tok_s"] < 2.5 * nearer, singles
    # the streams are spread over both: each replica's figure is a share of the total (half on
    # a quiet machine), and they add up (accounting: exact)
    for cell in (both, cells["decode[1K-c4]"]):
        split = cell["replica_tok_s"]
        assert len(split) == 2 and sum(split) == pytest.approx(cell["total_tok_s"], rel=1e-3)
        assert 0.5 < split[0] / split[1] < 2, split
        assert cell["status"] == "valid" and cell["generation_tokens_delta"] > 0
        assert cell["effective_concurrency"] == pytest.approx(cell["concurrency"], rel=0.15)
    assert 0.5 * nearer < both["replica_tok_s"][0] < 1.5 * nearer, singles
    assert doc["run"]["kv_capacity"] == 8192
    xml = JUnitXml.fromfile(str(pytester.path / "out.xml"))
    props = {
        case.name: {p.get("name"): p.get("value") for p in case._elem.iter("property")}
        for suite in xml
        for case in suite
    }
    c8 = props["test_decode[1K-c8]"]
    assert float(c8["replica1_total_tok_s"]) == both["replica_tok_s"][0]
    assert float(c8["replica2_total_tok_s"]) == both["replica_tok_s"][1]


@pytest.fixture
def tiny_process():
    with running_simulator_process(SimOptions(profile="tiny", speed=4.0)) as url:
        yield url


def test_replicas_that_serve_different_models_are_one_clear_error(pytester, tiny_process):
    other = "h200-qwen3.5-27b-int4"
    with running_simulator_process(SimOptions(profile=other, speed=10.0)) as url:
        result = pytester.runpytest(f"--llm-endpoint={tiny_process}", f"--llm-endpoint={url}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    model = PROFILES[other].served_model_name
    result.stderr.fnmatch_lines(
        [
            f"ERROR: pytest-llmspeed: the replicas serve different models: {tiny_process} "
            f"serves 'tiny', {url} serves '{model}'; give the endpoints of one model*"
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_replicas_with_different_versions_run_with_a_warning(pytester, tiny_process, monkeypatch):
    monkeypatch.setitem(
        PROFILES, "tiny-next", dataclasses.replace(PROFILES["tiny"], version="0.27.0")
    )
    with running_simulator(SimOptions(profile="tiny-next", speed=4.0)) as url:
        # the ini twin, one URL per line
        pytester.makeini(f"[pytest]\nllm_endpoint =\n    {tiny_process}\n    {url}\n")
        result = pytester.runpytest(
            "-m", "prefill", "--llm-contexts=1K", "--llm-results=out.json", "-p", "no:benchmark"
        )
    result.assert_outcomes(passed=1)
    warning = (
        f"warning: the replicas run different versions: {tiny_process} 0.26.1+llmspeed.sim, "
        f"{url} 0.27.0"
    )
    result.stdout.fnmatch_lines([f"note: {warning}"])
    doc = json.loads((pytester.path / "out.json").read_text())
    assert warning in doc["run"]["notes"]
    assert doc["run"]["endpoint"] == f"{tiny_process}, {url}"


def test_metrics_url_is_where_metrics_are_read(pytester):
    """A router without /metrics (here a simulator that has none) in front of a replica whose
    /metrics is elsewhere: the KV capacity comes from the metrics URL."""
    router = SimOptions(profile="tiny", speed=4.0, quirks="no-metrics")
    backend = SimOptions(profile="tiny", speed=4.0, kv_capacity=65536)
    with running_simulator_process(router) as url, running_simulator_process(backend) as metrics:
        result = pytester.runpytest(
            f"--llm-endpoint={url}",
            f"--llm-metrics-url={metrics}/metrics",
            "-m",
            "prefill",
            "--llm-contexts=1K",
            "--llm-results=out.json",
            "-p",
            "no:benchmark",
        )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "llmspeed server: * KV capacity 65,536 tokens (metrics URLs, per replica: *",
            f"note: /metrics read from --llm-metrics-url: {metrics}/metrics",
        ]
    )
    doc = json.loads((pytester.path / "out.json").read_text())
    assert doc["run"]["kv_capacity"] == 65536


@contextlib.contextmanager
def router(backends):
    """A round-robin router in front of ``backends`` that has no /metrics of its own (its own
    thread and event loop); yields its base URL."""
    import itertools

    from aiohttp import web

    from tests.forwarding import forwarding_server

    turn = itertools.cycle(backends)

    async def forward(request, session):
        if request.path == "/metrics":
            raise web.HTTPNotFound()
        backend = next(turn) if request.path.startswith("/v1/completions") else backends[0]
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with session.request(
            request.method, backend + request.path_qs, data=await request.read(), headers=headers
        ) as upstream:
            response = web.StreamResponse(status=upstream.status, headers=headers)
            response.content_type = upstream.content_type
            await response.prepare(request)
            async for data in upstream.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response

    with forwarding_server(forward) as url:
        yield url


@pytest.mark.slow
def test_a_router_without_metrics_is_refereed_by_its_replicas_metrics_urls(pytester):
    """Two replicas behind a router that has no /metrics: with --llm-metrics-url (one per
    replica) the capacity is per replica, and the server's counter, summed over both
    replicas, referees each decode cell (it would fail the cell if one were missing)."""
    opts = SimOptions(profile="tiny", speed=1.0, max_model_len=2048, kv_capacity=8192)
    with (
        running_simulator_process(opts) as a,
        running_simulator_process(dataclasses.replace(opts, seed=1)) as b,
        router([a, b]) as url,
    ):
        result = _matrix(pytester, url, "--llm-concurrency=8", f"--llm-metrics-url={a},{b}/metrics")
    result.assert_outcomes(passed=2)  # c=8 fits: 4 per replica behind the router
    result.stdout.fnmatch_lines(
        [
            "llmspeed server: * KV capacity 8,192 tokens (metrics URLs, per replica: the "
            "smallest of 2 replicas)",
            f"note: /metrics read from --llm-metrics-url: {a}/metrics, {b}/metrics",
        ]
    )
    _, cells = _decode(pytester)
    cell = cells["decode[1K-c8]"]
    assert cell["status"] == "valid" and cell["generation_tokens_delta"] > 0
    lo, hi = cell["received_span"]
    assert 0.9 * lo <= cell["generation_tokens_delta"] <= 1.1 * hi
    assert cell["effective_concurrency"] == pytest.approx(8, rel=0.15)  # summed gauges


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--llm-endpoint=sim,http://127.0.0.1:9"],
            "ERROR: --llm-endpoint='sim,http://127.0.0.1:9': the simulator is one endpoint: "
            "for simulated replicas give 'sim:PROFILE?replicas=2'",
        ),
        (
            ["--llm-endpoint=http://127.0.0.1:9,http://127.0.0.1:9/"],
            "ERROR: --llm-endpoint='http://127.0.0.1:9': given twice: each replica once",
        ),
        (
            ["--llm-endpoint=http://127.0.0.1:9,http://127.0.0.1:10", "--llm-metrics-url=http://a"],
            "ERROR: --llm-metrics-url='http://a': 1 metrics URL(s) for 2 endpoints: give one "
            "per endpoint, in the same order*",
        ),
        (
            ["--llm-endpoint=sim:tiny?replicas=0"],
            "ERROR: pytest-llmspeed: bad simulator spec *: replicas must be in 1..16, got 0",
        ),
    ],
)
def test_bad_replica_options_are_one_line(pytester, args, message):
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
