"""Predict the reference matrix with the simulator's engine model on a virtual clock.

Runs the real ``EngineCore`` of ``pytest_llmspeed.sim`` (no HTTP, no sleeping) through the
measurement protocol of METRICS.md and prints ``docs/reference-fit.md``'s tables:

- prefill cell at C: one cold request; TTFT and prompt tok/s = C / TTFT;
- decode cell (C, N): P(C) cached by the prefill request, N streams of P(C) + a unique 32-token
  suffix, 4096 output tokens, ``ignore_eos``, restarted as soon as one finishes; the window opens
  when the first N have their first token and lasts 30 s; total tok/s = tokens in window / 30;
- the over-capacity check N x (C + 4096) > KV capacity.

Usage: ``python -m benchmarks.reference_fit [--profile NAME] [--seed N]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from benchmarks.common import row, table
from pytest_llmspeed.sim.engine import EngineCore, SimRequest
from pytest_llmspeed.sim.profiles import Profile, get_profile

K = 1024
M = 4096
WINDOW = 30.0
SUFFIX = 32
CONTEXTS = {
    "8K": 8 * K,
    "16K": 16 * K,
    "32K": 32 * K,
    "64K": 64 * K,
    "128K": 128 * K,
    "251K": 251 * K,
}
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128)
REF_PREFILL = {
    "8K": (10100.0, 815),
    "16K": (9776.0, 1659),
    "32K": (9334.0, 3459),
    "64K": (8575.0, 7513),
    "128K": (7284.0, 17669),
    "251K": (5621.0, 44867),
    "256K": (5589.0, 46018),
}
REF_DECODE = {
    "8K": (148.2, 281.6, 538.0, 994.8, 1674.3, 2489.7, 3104.6, None),
    "16K": (142.5, 277.2, 526.9, 965.0, 1561.1, 2206.7, 2676.1, None),
    "32K": (141.0, 275.5, 505.7, 903.6, 1353.2, 1805.4, None, None),
    "64K": (135.7, 261.1, 470.3, 765.7, 1063.5, None, None, None),
    "128K": (130.3, 232.2, 397.9, 572.3, None, None, None, None),
    "251K": (116.7, 194.9, 295.0, None, None, None, None, None),
}
REF_DECODE_TTFT_MS = {
    "8K": (135, 336, 273, 350, 1673, 3043, 4275),
    "16K": (162, 228, 343, 838, 1622, 2739, 4372),
    "32K": (226, 293, 345, 1199, 1919, 2878),
    "64K": (320, 401, 803, 1368, 2548),
    "128K": (531, 700, 1220, 2242),
    "251K": (801, 1045, 1514),
}


class _Sink:
    def __init__(self, log: list[tuple[float, int]]) -> None:
        self.log = log

    def emit(self, req: SimRequest, n_new: int, finish: str | None, now: float) -> None:
        self.log.append((now, n_new))


@dataclass
class DecodeResult:
    total_tps: float
    ttft_ms: float
    per_request_tps: float


class VirtualRun:
    """One engine and its virtual clock, driven through the protocol."""

    def __init__(self, profile: Profile, seed: int) -> None:
        self.core = EngineCore(profile, seed=seed)
        self.now = 0.0
        self.rand = random.Random(seed)
        self.vocab = profile.vocab_size

    def ids(self, n: int) -> list[int]:
        r = self.rand
        return [r.randrange(300, self.vocab) for _ in range(n)]

    def step(self) -> list[tuple[SimRequest, int, str | None]]:
        core = self.core
        t = core.next_event(self.now)
        if t is None:
            raise RuntimeError("engine idle while requests are expected")
        self.now = max(self.now, t)
        plan = core.plan(self.now)
        if plan is None:
            raise RuntimeError("nothing schedulable")
        self.now += plan.duration
        return core.complete(plan, self.now)

    def prefill_cell(self, prompt: list[int], max_tokens: int) -> float:
        """TTFT (s) of one cold request."""
        req = SimRequest(prompt, max_tokens, ignore_eos=True)
        start = self.now
        self.core.add(req, start)
        while req.first_token_time is None:
            self.step()
        while req.state != "finished":
            self.step()
        return req.first_token_time - start

    def decode_cell(self, prefix: list[int], n: int) -> DecodeResult:
        core = self.core
        logs: dict[SimRequest, list[tuple[float, int]]] = {}
        first_wave: list[SimRequest] = []

        def start() -> SimRequest:
            log: list[tuple[float, int]] = []
            req = SimRequest(prefix + self.ids(SUFFIX), M, ignore_eos=True, sink=_Sink(log))
            logs[req] = log
            core.add(req, self.now)
            return req

        t0 = self.now
        for _ in range(n):
            first_wave.append(start())
        window_start: float | None = None
        while True:
            for req, n_new, finish in self.step():
                req.sink.emit(req, n_new, finish, self.now)  # type: ignore[union-attr]  # start() sets one
                if finish is not None:
                    start()
            if window_start is None and all(r.first_token_time is not None for r in first_wave):
                window_start = self.now
            if window_start is not None and self.now >= window_start + WINDOW:
                break
        end = window_start + WINDOW
        tokens = 0
        rates: list[tuple[int, float]] = []
        for log in logs.values():
            inside = [(t, k) for t, k in log if window_start <= t <= end and k > 0]
            count = sum(k for _, k in inside)
            tokens += count
            if count >= 2 and inside[-1][0] > inside[0][0]:
                rates.append((count, (count - 1) / (inside[-1][0] - inside[0][0])))
        ttfts = [
            r.first_token_time - r.arrival
            for r in logs
            if r.first_token_time is not None and r.first_token_time <= end
        ]
        for req in list(logs):
            core.abort(req)
        self.now = max(self.now, end)
        del t0
        weighted = sum(c * r for c, r in rates) / max(1, sum(c for c, _ in rates))
        return DecodeResult(tokens / WINDOW, statistics.median(ttfts) * 1e3, weighted)


def predict(profile: Profile, seed: int = 0) -> tuple[dict, dict]:
    """Prefill {label: (tok/s, ttft_ms)} and decode {(label, N): DecodeResult or None}."""
    prefill: dict[str, tuple[float, float]] = {}
    decode: dict[tuple[str, int], DecodeResult | None] = {}
    for label, c in CONTEXTS.items():
        run = VirtualRun(profile, seed)
        prefix = run.ids(c - SUFFIX)
        ttft = run.prefill_cell(prefix + run.ids(SUFFIX), 1)
        prefill[label] = (c / ttft, ttft * 1e3)
        for n, ref in zip(CONCURRENCY, REF_DECODE[label], strict=True):
            decode[(label, n)] = None if ref is None else run.decode_cell(prefix, n)
    run = VirtualRun(profile, seed)
    c = profile.max_model_len - 1
    ttft = run.prefill_cell(run.ids(c), 1)
    prefill["256K"] = (c / ttft, ttft * 1e3)
    return prefill, decode


def _pct(model: float, ref: float) -> str:
    return f"{(model / ref - 1) * 100:+.1f}%"


def report(profile: Profile, seed: int) -> tuple[str, float]:
    """Markdown tables and the worst relative error over the fitted figures."""
    prefill, decode = predict(profile, seed)
    worst = 0.0
    rows: list[list[object]] = []
    for label, (ref_tps, ref_ttft) in REF_PREFILL.items():
        tps, ttft = prefill[label]
        worst = max(worst, abs(tps / ref_tps - 1), abs(ttft / ref_ttft - 1))
        rows.append(
            [
                label, f"{ref_tps:,.0f}", f"{tps:,.0f}", _pct(tps, ref_tps), f"{ref_ttft:,}",
                f"{ttft:,.0f}", _pct(ttft, ref_ttft),
            ]
        )  # fmt: skip
    lines = [
        "### Prefill (cold prompt, one request)",
        "",
        *table(
            ["context", "ref tok/s", "model tok/s", "diff", "ref TTFT ms", "model TTFT ms", "diff"],
            rows,
            "lrrrrrr",
        ),
    ]
    rows = []
    for label in CONTEXTS:
        for i, n in enumerate(CONCURRENCY):
            ref = REF_DECODE[label][i]
            res = decode[(label, n)]
            if ref is None or res is None:
                continue
            worst = max(worst, abs(res.total_tps / ref - 1))
            rows.append(
                [
                    label, n, f"{ref:,.1f}", f"{res.total_tps:,.1f}", _pct(res.total_tps, ref),
                    f"{res.per_request_tps:,.1f}", f"{REF_DECODE_TTFT_MS[label][i]:,}",
                    f"{res.ttft_ms:,.0f}",
                ]
            )  # fmt: skip
    header = ["context", "N", "ref tok/s", "model tok/s", "diff", "model per-request tok/s"]
    lines += [
        "",
        "### Sustained decode, total tok/s (N streams, 4096-token outputs, 30 s)",
        "",
        *table([*header, "ref TTFT ms", "model TTFT ms"], rows, "lrrrrrrr"),
    ]
    cap = profile.kv_capacity_tokens
    lines += [
        "",
        f"### Over capacity: N x (C + {M}) > {cap:,} tokens",
        "",
        *table(["context", *map(str, CONCURRENCY)], [], "l" + "c" * len(CONCURRENCY)),
    ]
    over = agree = 0
    for label, c in CONTEXTS.items():
        cells = []
        for i, n in enumerate(CONCURRENCY):
            model_over = n * (c + M) > cap
            ref_over = REF_DECODE[label][i] is None
            over += model_over
            agree += model_over == ref_over
            cells.append(
                ("over" if model_over else "fits")
                + ("" if model_over == ref_over else " (MISMATCH)")
            )
        lines.append(row(label, *cells))
    total = len(CONTEXTS) * len(CONCURRENCY)
    lines += [
        "",
        f"Over-capacity cells: {over} (reference: 16); cells agreeing with the "
        f"reference: {agree} of {total}.",
    ]
    return "\n".join(lines), worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200-qwen3.5-27b-int4")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    text, worst = report(get_profile(args.profile), args.seed)
    print(text)
    print(
        f"\nWorst relative error over prefill tok/s, prefill TTFT and decode total tok/s: "
        f"{worst * 100:.1f}%"
    )


if __name__ == "__main__":
    main()
