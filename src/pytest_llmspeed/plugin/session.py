"""Per-session state of the pytest layer: the bench, the simulator, the cell records, the notes.

Lives in ``config.stash``; created at configure time without network, started at session start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from .. import __version__
from ..core.bench import Bench, BenchConfig
from ..core.errors import LLMSpeedError, redact
from ..core.launch import LaunchedServer
from ..core.matrix import Skip, context_label, decode_skip, exceeds_max_model_len
from ..core.protocol import DecodeResult, DecodeTick, PrefillResult
from ..core.records import prefill_record
from ..gate.baseline import Baseline, mismatches
from ..gate.baseline import dump as dump_baseline
from ..gate.baseline import load as load_baseline
from ..gate.verdict import Accounting
from ..report.compare import Comparison
from ..results import MAX, CellId, CellRecord, Results, RunInfo, Status
from .progress import Progress
from .settings import Settings


def public_url(url: str) -> str:
    """The endpoint without credentials or query (they may hold secrets)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if not parts.scheme.startswith("http"):
        return url.split("?")[0]
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _loopback(url: str | None) -> bool:
    host = urlsplit(url).hostname if url else None
    return host in ("127.0.0.1", "localhost", "::1")


class LLMSpeedRun:
    """One pytest session's benchmark run."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.bench: Bench | None = None
        self.base_url: str | None = None
        self.notes: list[str] = list(settings.notes)
        self.cells: dict[str, CellRecord] = {}
        self._sim: contextlib.ExitStack | None = None
        self.started = False
        self.started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        self.fatal: str | None = None
        self.baseline: Baseline | None = None
        #: ids of the cells this session set out to measure (its items after -m / -k)
        self.selected: set[str] = set()
        #: which rule added or left out the built-in suite, in words
        self.suite_rule = ""
        self.server_line = ""
        self.progress: Progress | None = None
        #: sees each decode window about once a second (the live line on a terminal)
        self.on_tick: Callable[[DecodeTick], None] | None = None
        self.node_cells: dict[str, CellId] = {}  # test node id → the cell it measures
        self.server: LaunchedServer | None = None  # started by --llm-serve
        self.engine_packages: dict[str, str] = {}
        self.machine: dict[str, str] = {}
        if settings.baseline:
            self.baseline = load_baseline(settings.baseline)  # BaselineError: bad file
        self.earlier: Results | None = None
        if settings.compare:
            from ..results import load

            self.earlier = load(settings.compare)  # ResultsError: not a results file

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the simulator if asked, connect, probe. Raises LLMSpeedError / ValueError."""
        s = self.settings
        if s.serve_plan is not None:
            self._launch()
        endpoints = s.endpoints
        if s.is_sim:
            from ..sim import parse_sim_spec, running_simulator_processes  # only when asked for

            options = parse_sim_spec(s.endpoint)
            self._sim = contextlib.ExitStack()
            try:
                urls = self._sim.enter_context(running_simulator_processes(options))
            except RuntimeError as exc:
                self.stop()
                raise LLMSpeedError(str(exc)) from None
            self.base_url = urls[0]
            endpoints = tuple(urls) if len(urls) > 1 else ()
            self.notes.append(
                f"built-in simulator: {s.endpoint.split('?')[0]} at {', '.join(urls)}"
            )
        else:
            self.base_url = s.endpoint
        self.bench = Bench(
            BenchConfig(
                base_url=self.base_url,
                api_key=s.api_key,
                model=s.model,
                api=s.api,
                max_output=s.max_output,
                duration=s.duration,
                precision=s.precision,
                min_duration=s.min_duration,
                prefill_repeats=s.prefill_repeats,
                text_prompts=s.prompt_form == "text",
                timeout=s.timeout,
                kv_capacity=s.kv_capacity,
                kv_capacity_source="--llm-kv-capacity",
                max_model_len=s.max_model_len,
                endpoints=endpoints,
                metrics_urls=s.metrics_urls,
            )
        )
        try:
            self.bench.start()
        except BaseException:
            self.stop()
            raise
        assert self.bench.dialect is not None and self.bench.server is not None
        self.notes.extend(self.bench.server.notes)
        if self.bench.server.metrics_urls:
            self.notes.append(
                "/metrics read from --llm-metrics-url: "
                + ", ".join(public_url(u) for u in self.bench.server.metrics_urls)
            )
        self.notes.extend(self.bench.dialect.notes)
        if self.bench.server.max_model_len is None and MAX in (*s.contexts, *s.prefill_contexts):
            self.stop()
            raise LLMSpeedError(
                "the context 'max' needs the server's max_model_len, which it does not report "
                "(not in /v1/models, nor in a /tokenize answer)",
                setting="max_model_len",
            )
        if self.settings.serve_plan is not None or _loopback(self.base_url):
            from ..core.machine import hardware

            self.machine = hardware()  # the server runs on this machine
        if self.bench.server and self.bench.server.kv_capacity is None:
            self.notes.append("KV capacity unknown: every cell ran (no over-capacity skips)")
        self.write_results()
        self.server_line = self.header()[0].removeprefix("llmspeed server: ")
        self.started = True
        if self.baseline is not None:
            diff = mismatches(self.baseline, self.comparable())
            if diff:
                what = f"baseline {self.baseline.path} was taken with other settings: " + "; ".join(
                    diff
                )
                if s.baseline_strict:
                    self.stop()
                    raise LLMSpeedError(what + " (--llm-baseline-strict)")
                self.notes.append("warning: " + what)

    @property
    def prompt_form(self) -> str:
        """What the prompts are sent as: the option, unless the server refused token ids."""
        factory = self.bench.factory if self.bench else None
        if factory is None:
            return self.settings.effective_prompt_form
        return "ids" if factory.uses_ids else "text"

    def comparable(self) -> dict[str, Any]:
        """The run settings a baseline must share to be compared with this run."""
        server = self.bench.server if self.bench else None
        return {
            "model": server.model if server else self.settings.model,
            "api": self.settings.api,
            "prompt_form": self.prompt_form,
            "max_output": self.settings.max_output,
            "duration_s": self.settings.duration,
            "prefill_repeats": self.settings.prefill_repeats,
            # several replicas multiply throughput: a baseline of one is not a floor for two
            "replicas": server.replica_count if server else None,
        }

    def save_baseline(self) -> str | None:
        if not self.settings.save_baseline or not self.cells:
            return None
        server = self.bench.server if self.bench else None
        run = {
            **self.comparable(),
            "engine": server.engine if server else None,
            "engine_version": server.version if server else None,
            "server": self.public_endpoint,
            "kv_capacity": server.kv_capacity if server else None,
        }
        n = dump_baseline(self.settings.save_baseline, run, list(self.cells.values()))
        return f"baseline: {n} cells written to {self.settings.save_baseline}"

    def _launch(self) -> None:
        """--llm-serve: start the server command and wait until it answers (LaunchError)."""
        from ..core.launch import launch, wait_healthy

        s = self.settings
        log = (
            Path(s.serve_log)
            if s.serve_log
            else (Path(s.results).parent if s.results else Path()) / "llmspeed-serve.log"
        )
        self.server = launch(s.serve_plan, log)
        try:
            took = wait_healthy(self.server, s.serve_timeout)
        except BaseException:
            self.stop()
            raise
        self.notes.append(
            f"server started by --llm-serve, answering after {took:.0f} s; its log: {log}"
        )
        from ..core.launch import engine_python
        from ..core.machine import engine_packages

        python = engine_python(s.serve_plan)
        if python is not None:
            self.engine_packages = engine_packages(python)

    def server_exited(self) -> str | None:
        """Why the launched server is gone (exit code, log's last lines), or None."""
        if self.server is None or self.server.exit_code() is None:
            return None
        return self.server.exited_message("during the run")

    def stop(self) -> None:
        if self.bench is not None:
            with contextlib.suppress(Exception):
                self.bench.close()
            self.bench = None
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self._sim is not None:
            self._sim.close()
            self._sim = None

    def run_info(self) -> RunInfo:
        """What this run is, as the results model records it."""
        server = self.bench.server if self.bench else None
        dialect = self.bench.dialect if self.bench else None
        factory = self.bench.factory if self.bench else None
        return RunInfo(
            tool=f"pytest-llmspeed {__version__}",
            started=self.started_at,
            endpoint=self.public_endpoint,
            model=server.model if server else self.settings.model,
            engine=server.engine if server else None,
            engine_version=server.version if server else None,
            max_model_len=server.max_model_len if server else None,
            kv_capacity=server.kv_capacity if server else None,
            kv_capacity_source=server.kv_capacity_source if server else None,
            api=dialect.api if dialect else None,
            prompt_form=self.prompt_form,
            notes=tuple(self.notes),
            settings=self.settings.public(),
            salt=factory.salt if factory else None,
            python=sys.version.split()[0],
            platform=platform.platform(),
            pytest=pytest.__version__,
            metadata={**self.machine, **self.engine_packages, **dict(self.settings.meta)},
            launch_command=self.settings.launch_command
            or (self.settings.serve_plan.shown if self.settings.serve_plan else None),
        )

    def results(self) -> Results:
        return Results(self.run_info(), tuple(self.cells.values()))

    def write_results(self) -> None:
        """Rewrite the results file and the registered outputs asked for (after every cell:
        a run that dies keeps what it measured)."""
        if not (self.settings.results or self.settings.outputs):
            return
        results = self.results()
        if self.settings.results:
            results.dump(self.settings.results)
        if self.settings.outputs:
            comparison = self.comparison(results)
            for output, path in self.settings.outputs:
                output.write(results, comparison, path)

    def comparison(self, results: Results | None = None) -> Comparison | None:
        """This run against the earlier one (--llm-compare), or None."""
        if self.earlier is None:
            return None
        from ..report.compare import compare

        return compare(self.earlier, results or self.results())

    def header(self) -> list[str]:
        if not self.bench or not self.bench.server:
            return [f"llmspeed: endpoint {self.public_endpoint} (not probed)"]
        s = self.settings
        described = self.bench.server.describe()
        for url in {self.bench.server.base_url, *self.bench.server.replicas}:
            described = described.replace(url, public_url(url))
        return [
            "llmspeed " + self.redact(described),
            f"llmspeed: api {s.api} ({'token-id' if self.prompt_form == 'ids' else 'text'} "
            "prompts) · "
            f"max output {s.max_output} · {self.window_words} · "
            f"contexts {','.join(context_label(c) for c in s.contexts)} · "
            f"concurrency {','.join(map(str, s.concurrency))}",
        ]

    @property
    def window_words(self) -> str:
        """``window 30 s``, or with --llm-precision ``window 5–30 s, until ±2%``."""
        s = self.settings
        if s.precision is None:
            return f"window {s.duration:g} s"
        return f"window {s.min_duration:g}–{s.duration:g} s, until ±{s.precision:.1%}"

    @property
    def public_endpoint(self) -> str:
        """The endpoint, or the replicas' endpoints comma-separated, without secrets."""
        return ", ".join(
            public_url(e) for e in self.settings.endpoints or (self.settings.endpoint,)
        )

    def redact(self, text: str) -> str:
        return redact(text, self.settings.api_key)

    # -- cells -----------------------------------------------------------------------------

    def record(self, rec: CellRecord) -> None:
        """Keep a cell's record (replacing an earlier one of the same cell) and write the
        results file."""
        factory = self.bench.factory if self.bench else None
        for note in factory.notes if factory else ():
            if note not in self.notes:
                self.notes.append(note)
        self.cells[str(rec.id)] = rec
        self.write_results()

    def resolve(self, context: int | str) -> int | None:
        return self.bench.resolve(context) if self.bench is not None else None

    def skip(self, cid: CellId) -> Skip | None:
        """Why a cell cannot run on this server (known after the probe), else None."""
        if self.bench is None or self.bench.server is None:
            return None
        limits = self.bench.limits
        tokens = self.bench.resolve(cid.context)
        if tokens is None:
            return Skip(
                Status.DOES_NOT_FIT,
                "context 'max' needs the server's max_model_len, which it does not report",
            )
        if tokens < 1:
            return Skip(
                Status.DOES_NOT_FIT,
                f"context max resolves to {tokens} tokens (max_model_len too small for output)",
            )
        if cid.concurrency is None:
            return exceeds_max_model_len(tokens, 1, limits)
        return decode_skip(tokens, cid.concurrency, self.settings.max_output, limits)

    def warm(self, context: int | str) -> tuple[int, PrefillResult]:
        """The prefill cell at ``context``: the cold request that warms the shared prefix."""
        assert self.bench is not None
        tokens = self.bench.resolve(context)
        assert tokens is not None
        fits = not exceeds_max_model_len(tokens, self.settings.max_output, self.bench.limits)
        max_tokens = min(self.settings.max_output, 16) if fits else 1
        first = tokens not in self.bench.prefills
        result = self.bench.prefill(tokens, max_tokens)
        if first:
            self.record(prefill_record(context, result))
        return tokens, result

    def decode(self, tokens: int, concurrency: int) -> DecodeResult:
        assert self.bench is not None
        return self.bench.decode(tokens, concurrency, on_tick=self.on_tick)

    # -- the gate --------------------------------------------------------------------------

    def gate_warmups(self, remeasure: bool) -> None:
        """Gate the prefill figures that decode warm-ups measured when no prefill test ran
        (``-m decode``): what a run measures is gated, whatever selected it. A warm-up that is
        not comparable with the baseline's prefill cell says why instead."""
        from ..core.records import prefill_record
        from ..gate.verdict import NOT_GATED, gated, verdict, wants_another
        from ..report.terminal import WARMUP_NOTE

        if self.baseline is None:
            return
        for cid, record in list(self.cells.items()):
            entry = self.baseline.cells.get(cid)
            if entry is None or not record.measured or record.gate is not None:
                continue
            base_repeats = self.baseline.run.get("prefill_repeats", 1)
            if base_repeats != self.settings.prefill_repeats:
                why = (
                    f"{NOT_GATED}the baseline's prefill is the median of {base_repeats} cold "
                    f"request(s), this warm-up of {self.settings.prefill_repeats}"
                )
                self.record(dataclasses.replace(record, notes=(*record.notes, why)))
                continue
            attempts = [record]
            notes = [WARMUP_NOTE]
            tokens, max_tokens = record.context_tokens, record.max_tokens
            while (
                remeasure
                and self.bench is not None
                and wants_another(entry, attempts, self.settings.confirm)
            ):
                assert tokens is not None and max_tokens is not None
                try:
                    again = self.bench.prefill_again(tokens, max_tokens)
                except LLMSpeedError as exc:  # gate on what was measured, and say so
                    notes.append(self.redact(f"re-measurement failed: {exc}"))
                    break
                attempts.append(prefill_record(record.id.context, again))
            result = gated(record, verdict(entry, attempts), attempts)
            self.record(dataclasses.replace(result, notes=(*result.notes, *notes)))

    def accounting(self) -> Accounting | None:
        from ..gate.verdict import account

        if self.baseline is None:
            return None
        return account(self.baseline, self.cells.values(), self.selected)

    def healthy(self) -> bool:
        return self.bench is not None and self.bench.healthy()
