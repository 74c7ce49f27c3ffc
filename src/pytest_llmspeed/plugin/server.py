"""The server under test, over one session: started (the simulator, the ``--llm-serve``
command), connected and probed when a selected test first needs it, stopped at the end.

What the probe found (the server's identity, the dialect, the prompt factory) is kept after
the server stops: the results written at the session's end still say what was measured.
Import-light: the core's client and the simulator are imported when the server starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..contexts import LIMIT, MAX
from ..core.errors import LLMSpeedError, redact
from ..core.matrix import Skip, context_label, decode_skip, exceeds_max_model_len
from ..core.text import for_person, printable

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from ..core.bench import Bench
    from ..core.launch import LaunchedServer
    from ..core.probe import ServerInfo
    from ..core.prompts import PromptFactory
    from ..core.protocol import DecodeResult, DecodeTick, PrefillResult
    from ..core.wire import Dialect
    from ..results import CellId, Phase
    from .settings import Settings


#: seconds between a cell that missed its baseline and its re-measurement on a server the
#: plugin did not start (and so cannot restart)
PAUSE_S = 5.0


def public_url(url: str) -> str:
    """The endpoint without credentials or query (they may hold secrets); the simulator's
    spec with its options (``sim:PROFILE?speed=10``: what it simulates depends on them), its
    ``api_key`` out."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if not parts.scheme.startswith("http"):
        spec, _, query = url.partition("?")
        kept = [
            (k, v)
            for k, v in parse_qsl(query, keep_blank_values=True)
            if k.strip().replace("-", "_") != "api_key"
        ]
        return f"{spec}?{urlencode(kept, safe=':,')}" if kept else spec
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _loopback(url: str | None) -> bool:
    host = urlsplit(url).hostname if url else None
    return host in ("127.0.0.1", "localhost", "::1")


#: starts of --llm-serve's command when its port was taken before it bound it (each on a new
#: free port): the port is chosen free, then the server binds it tens of seconds later
PORT_TRIES = 3


class ServerUnderTest:
    """The server's lifecycle and what the probe found."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.started = False  # connected and probed
        self.bench: Bench | None = None  # while connected
        self.base_url: str | None = None  # the endpoint, or the simulator's address
        self.launched: LaunchedServer | None = None  # started by --llm-serve
        #: the probe's facts, kept after the server stops
        self.info: ServerInfo | None = None
        self.dialect: Dialect | None = None
        self.factory: PromptFactory | None = None
        self.notes: list[str] = []  # what starting it found out, in words
        self.machine: dict[str, str] = {}  # what a server on this machine runs on
        self.engine_packages: dict[str, str] = {}  # the launched engine's versions
        self.server_line = ""  # the first header line, without its "llmspeed server: "
        #: why the run stopped (the key refused, the server gone), once it has
        self.fatal: str | None = None
        self._sim: contextlib.ExitStack | None = None
        self.restarts = 0  # restarts to re-measure a cell (a miss to confirm, an unknown)

    @property
    def restartable(self) -> bool:
        """Started by the plugin (--llm-serve, the simulator), so it can start it again."""
        return self.settings.serve_plan is not None or self.settings.is_sim

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the simulator or the --llm-serve command if asked, connect, probe.
        Raises LLMSpeedError / ValueError (and stops what it started)."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.server_line = self.header()[0].removeprefix("llmspeed server: ")
        self.started = True

    def _start(self, restart: bool = False) -> None:
        from ..core.bench import Bench, BenchConfig
        from ..gate.slo import request_bounds

        if self.settings.serve_plan is not None:
            self._launch(restart)  # may move it to another port: the settings are read after
        s = self.settings
        endpoints = s.endpoints
        if s.is_sim:
            from ..sim import parse_sim_spec, running_simulator_processes  # only when asked for

            self._sim = contextlib.ExitStack()
            simulators = running_simulator_processes(parse_sim_spec(s.endpoint))
            try:
                urls = self._sim.enter_context(simulators)
            except RuntimeError as exc:
                raise LLMSpeedError(str(exc)) from None
            self.base_url = urls[0]
            endpoints = tuple(urls) if len(urls) > 1 else ()
            self.notes.append(f"built-in simulator: {public_url(s.endpoint)} at {', '.join(urls)}")
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
                prompt_text=s.prompt_text,
                timeout=s.timeout,
                kv_capacity=s.kv_capacity,
                kv_capacity_source="--llm-kv-capacity",
                max_model_len=s.max_model_len,
                endpoints=endpoints,
                metrics_urls=s.metrics_urls,
                max_error_rate=s.max_error_rate,
                request_bounds=request_bounds(s.slo) if s.slo else None,
                client_processes=s.client_processes,
                tools=s.tools,
            )
        )
        self.info = self.bench.start()
        self.dialect, self.factory = self.bench.dialect, self.bench.factory
        assert self.dialect is not None
        self.notes.extend(self.info.notes)
        if self.info.metrics_urls:
            self.notes.append(
                "/metrics read from --llm-metrics-url: "
                + ", ".join(public_url(u) for u in self.info.metrics_urls)
            )
        self.notes.extend(self.dialect.notes)
        named = [c for c in (MAX, LIMIT) if c in (*s.contexts, *s.prefill_contexts)]
        if self.info.max_model_len is None and named:
            # a value the server sent and the probe refused is named (1e30, -5, true)
            refused = next(
                (n for n in self.info.notes if n.startswith("max_model_len") and "unknown" in n),
                None,
            )
            why = (
                f"the server's is not usable ({refused})"
                if refused
                else "which it does not report (not in /v1/models, nor in a /tokenize answer)"
            )
            raise LLMSpeedError(
                f"the context '{named[0]}' needs the server's max_model_len, {why}",
                setting="max_model_len",
            )
        self._memory()
        if self.info.kv_capacity is None:
            self.notes.append("KV capacity unknown: every cell ran (no over-capacity skips)")

    def _memory(self) -> None:
        """The hardware the server runs on, and what the bandwidth bound needs: the
        simulator's profile names the GPU it simulates (its peak scaled by the speed, as its
        steps are); a server started here, or on loopback, runs on this machine."""
        from ..core.bandwidth import memory_model

        assert self.bench is not None
        s = self.settings
        meta = dict(s.meta)
        if s.is_sim:
            from ..sim import parse_sim_spec
            from ..sim.profiles import get_profile

            options = parse_sim_spec(s.endpoint)
            profile = get_profile(options.profile)
            if profile.hardware:
                speed = f"{options.speed:g}x"
                self.machine = {"hardware": f"{profile.hardware} (simulated, speed {speed})"}
            model = memory_model(
                meta,
                hardware=profile.hardware,
                weight_bytes=profile.weight_bytes,
                kv_bytes_per_token=profile.kv_bytes_per_token,
                source=f"the simulator's profile {profile.name}",
            )
            if model.peak_bytes_per_s and "peak_bandwidth" not in meta:
                model = dataclasses.replace(
                    model,
                    peak_bytes_per_s=model.peak_bytes_per_s * options.speed,
                    peak_source=f"{model.peak_source}, × speed {options.speed:g} (simulated)",
                )
        else:
            if s.serve_plan is not None or _loopback(self.base_url):
                from ..core.machine import hardware

                self.machine = hardware()  # the server runs on this machine
            model = memory_model(meta)
        self.bench.config.memory = model

    def restart(self) -> None:
        """Stop the server the session started and start it again: a fresh start (the engine
        lays out memory and picks kernels anew; the simulator draws a new start factor),
        connected and probed again. The first start's notes stay. Raises LLMSpeedError /
        ValueError (and stops what it started)."""
        assert self.restartable
        notes = list(self.notes)
        self.stop()
        self.started = False
        try:
            self._start(restart=True)
        except BaseException:
            self.stop()
            raise
        self.notes = notes
        self.started = True

    def switch(self, settings: Settings) -> None:
        """An A/B's next round: stop this server, and start (or connect to) the one of
        ``settings``, the other version's; probed again. The first start's notes stay.
        Raises LLMSpeedError / ValueError (and stops what it started)."""
        notes = list(self.notes)
        self.stop()
        self.started = False
        self.settings = settings
        try:
            self._start(restart=True)
        except BaseException:
            self.stop()
            raise
        self.notes = notes
        self.started = True

    def fresh_start(self, context: int | str | None) -> None:
        """Before re-measuring a cell that missed its baseline: restart the server when the
        plugin started it, and warm ``context``'s shared prefix again (None: a replayed
        trace's cell, whose prompts are its own); the confirmation then samples the noise
        between starts, ``fresh_starts=True``. Else pause :data:`PAUSE_S` seconds. Raises
        LLMSpeedError / ValueError when the restart fails."""
        if not self.restartable:
            time.sleep(PAUSE_S)
            return
        self.restart()
        self.restarts += 1
        assert self.bench is not None
        if context is None:
            return
        tokens = self.bench.resolve(context)
        assert tokens is not None
        self.bench.rewarm(tokens, self._warm_tokens(tokens))

    def remeasured_words(self, times: int) -> str:
        """How a cell's re-measurements were taken, for its notes."""
        if self.restartable:
            return f"re-measured {times} time(s), each after restarting the server"
        return (
            f"re-measured {times} time(s), each after a {PAUSE_S:g} s pause (a server the "
            "plugin did not start is not restarted)"
        )

    def _launch(self, restart: bool = False) -> None:
        """--llm-serve: start the server command and wait until it answers (LaunchError)."""
        from pathlib import Path

        from ..core.launch import (
            LaunchError,
            engine_python,
            foreign_listener,
            launch,
            plan,
            wait_healthy,
        )
        from ..core.machine import engine_packages

        s = self.settings
        log = (
            Path(s.serve_log)
            if s.serve_log
            else (Path(s.results).parent if s.results else Path()) / "llmspeed-serve.log"
        )
        for attempt in range(1, PORT_TRIES + 1):
            assert s.serve_plan is not None
            self.launched = launch(s.serve_plan, log, append=restart or attempt > 1)
            try:
                took = wait_healthy(self.launched, s.serve_timeout)
                break
            except LaunchError:
                taken = "Address already in use" in self.launched.tail(40)
                if attempt == PORT_TRIES or not taken or s.serve is None or "{port}" not in s.serve:
                    raise
            # the free port chosen was taken by another process before the server bound it
            # (other servers start on this machine too): a fresh port, the command again
            was = s.serve_plan.port
            s = self.settings = dataclasses.replace(
                s, serve_plan=(new := plan(s.serve)), endpoint=new.url
            )
            self.notes.append(
                f"--llm-serve: port {was} was taken by another process before the server bound "
                f"it; started again on port {new.port}"
            )
        self.notes.append(
            f"server started by --llm-serve, answering after {took:.0f} s; its log: {log}"
        )
        other = foreign_listener(self.launched) if self.launched is not None else None
        if other is not None:
            self.notes.append(
                f"port {s.serve_plan.port} is held by {other}, not by a process of the "
                "--llm-serve command: unless that is the command's own proxy (docker -p), "
                "another server took the port and the figures are that server's"
            )
        python = engine_python(s.serve_plan)
        if python is not None:
            self.engine_packages = engine_packages(python)

    def stop(self) -> None:
        """Close the connection, stop what the session started (each only once)."""
        if self.bench is not None:
            with contextlib.suppress(Exception):
                self.bench.close()
            self.bench = None
        if self.launched is not None:
            self.launched.stop()
            self.launched = None
        if self._sim is not None:
            self._sim.close()
            self._sim = None

    def exited(self) -> str | None:
        """Why the launched server is gone (exit code, log's last lines), or None."""
        if self.launched is None or self.launched.exit_code() is None:
            return None
        return self.launched.exited_message("during the run")

    def healthy(self) -> bool:
        return self.bench is not None and self.bench.healthy()

    def give_up(self, why: str) -> str:
        """Stop using the server for the rest of the session: tests that need it fail with
        ``why`` (redacted)."""
        self.fatal = self.redact(why)
        return self.fatal

    def unusable_after(self, exc: Exception) -> str | None:
        """After an error in a cell: why the session cannot go on (the key refused, the
        launched server gone, the server no longer answering), else None."""
        from ..core.errors import KeyRejected
        from .messages import describe

        if isinstance(exc, KeyRejected):
            self.give_up(f"stopped: {describe(exc)}")
        elif self.exited():
            self.give_up(f"stopped: {self.exited()}\nResults measured so far are kept.")
        elif not self.healthy():
            self.give_up(
                f"stopped: the server at {self.base_url} stopped answering ({exc}). "
                "Results measured so far are kept."
            )
        return self.fatal

    # -- what the probe found --------------------------------------------------------------

    @property
    def prompt_form(self) -> str:
        """What the prompts are sent as: the option, unless the server refused token ids."""
        if self.factory is None:
            return self.settings.effective_prompt_form
        return "ids" if self.factory.uses_ids else "text"

    def resolve(self, context: int | str) -> int | None:
        return self.bench.resolve(context) if self.bench is not None else None

    def skip(self, cid: CellId) -> Skip | None:
        """Why a cell cannot run on this server (known after the probe), else None."""
        from ..results import Status

        if self.bench is None or self.info is None:
            return None
        limits = self.bench.limits
        tokens = self.bench.resolve(cid.context)
        if tokens is None:
            return Skip(
                Status.DOES_NOT_FIT,
                f"context '{cid.context}' needs the server's max_model_len, which it does not "
                "report",
            )
        if tokens < 1:
            return Skip(
                Status.DOES_NOT_FIT,
                f"context {cid.context} resolves to {tokens} tokens (max_model_len too small "
                "for the output)",
            )
        if cid.concurrency is None:
            return exceeds_max_model_len(tokens, 1, limits)
        if cid.turns is not None:  # a conversation: its first turn must fit (later ones end)
            return exceeds_max_model_len(tokens, self.settings.turn_output, limits)
        return decode_skip(tokens, cid.concurrency, self.settings.max_output, limits)

    # -- cells -----------------------------------------------------------------------------

    def warm(self, context: int | str) -> tuple[int, PrefillResult, bool]:
        """The cold request that warms the shared prefix of ``context``: its length in tokens,
        the result, and whether it was the first at that length (the prefill cell)."""
        assert self.bench is not None
        tokens = self.bench.resolve(context)
        assert tokens is not None
        first = tokens not in self.bench.prefills
        return tokens, self.bench.prefill(tokens, self._warm_tokens(tokens)), first

    def _warm_tokens(self, tokens: int) -> int:
        """max_tokens of the request that warms a prefix of ``tokens``."""
        assert self.bench is not None
        fits = not exceeds_max_model_len(tokens, self.settings.max_output, self.bench.limits)
        return min(self.settings.max_output, 16) if fits else 1

    def decode(
        self, tokens: int, concurrency: int, on_tick: Callable[[DecodeTick], None] | None = None
    ) -> DecodeResult:
        assert self.bench is not None
        return self.bench.decode(tokens, concurrency, on_tick=on_tick)

    # -- in words --------------------------------------------------------------------------

    def header(
        self,
        shown: Callable[[object], str] = for_person,
        selected: str | None = None,
        phases: Collection[Phase] | None = None,
    ) -> list[str]:
        """The server line and the run's settings line; each of the server's own strings
        (model, engine, version) through ``shown``: the one gate to a person (no control
        character, no line break, at most 200 characters), or Markdown's. ``selected``: what
        the session runs, in words (``Selection.words``); without it, the settings' matrix.
        ``phases``: the kinds of the selected cells, each with its own settings (a trace's
        cells have no window and no max output of ours; conversations their turns')."""
        if self.info is None:
            return [f"llmspeed: endpoint {self.public_endpoint} (not probed)"]
        s = self.settings
        info = self.info
        safe = dataclasses.replace(
            info,
            model=shown(info.model),
            engine=shown(info.engine),
            version=None if info.version is None else shown(info.version),
        )
        described = safe.describe()
        for url in {info.base_url, *info.replicas}:
            described = described.replace(url, public_url(url))
        from ..results import Phase

        kinds = set(Phase) if phases is None else set(phases)
        settings = []
        if kinds & {Phase.PREFILL, Phase.DECODE, Phase.RATE}:
            settings.append(f"max output {s.max_output} · {self.window_words}")
        if Phase.RATE in kinds and s.rate_prompts == "cold":  # new users' TTFTs
            settings.append("rate cells: each request a cold prompt of its own")
        elif Phase.RATE in kinds:  # what its TTFTs are: returning users', on a warm prefix
            settings.append("rate cells: each request the context's shared prefix, warm")
        if Phase.TRACE in kinds and s.trace_speed != 1:
            settings.append(f"trace at {s.trace_speed:g}× its speed")
        if Phase.CONVERSATION in kinds and s.turns:
            settings.append(
                f"turns of {s.turn_tokens} new tokens, at most {s.turn_output} out, "
                f"{s.think_time:g} s apart"
            )
        settings.append(
            selected
            if selected is not None
            else f"contexts {','.join(context_label(c) for c in s.contexts)} · "
            f"concurrency {','.join(map(str, s.concurrency))}"
        )
        lines = [
            "llmspeed " + self.redact(described),
            f"llmspeed: api {s.api} ({'token-id' if self.prompt_form == 'ids' else 'text'} "
            "prompts) · " + " · ".join(settings),
        ]
        if s.preset_note:  # what --llm-preset set, and what was given instead
            lines.append(f"llmspeed: {s.preset_note}")
        if s.proxy_note:  # the environment's setting the run does not follow, said up front
            lines.append(f"llmspeed: {s.proxy_note}")
        return lines

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
        """``text`` for an output (the terminal, JUnit, the files): every known secret out
        (the key, the values in --llm-serve's command), control characters out, no line
        that starts with ``::`` (core.text.printable)."""
        return printable(redact(text, self.settings.api_key))
