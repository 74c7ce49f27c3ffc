"""Options, their ini twins and environment variables, validated into one frozen Settings.

Precedence, lowest first: ini file < environment < command line.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from ..report.outputs import OUTPUTS, Output

if TYPE_CHECKING:  # the rest is imported when the settings are read: an endpoint was given
    from ..core.text import Secret

DEFAULT_CONTEXTS = "8K,16K,32K,64K,128K,max"
DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64,128"
#: cold requests per prefill cell when a baseline is saved or gated: their median carries an
#: interval (an order statistic's), so the gate does not fail a build on one request's TTFT
GATED_PREFILL_REPEATS = 6
#: in an A/B: twice as many, since a round's restart costs far more than its cold requests
#: and a prefill cell's own noise is most of its block's variance (docs/judge.md, "A prior from
#: earlier A/Bs": with 6, prefill cells took 12 starts where decode cells took 8)
AB_PREFILL_REPEATS = 12


@dataclass(frozen=True)
class Option:
    """One ``--llm-*`` option with its ini twin (``llm_*``) and environment variables."""

    name: str  # without the leading --llm-
    help: str
    default: str | None = None
    env: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    switch: bool = False  # a switch: --llm-x on the command line, true/false in the ini file
    repeat: bool = False  # may be given several times (the ini twin: one per line)

    @property
    def flag(self) -> str:
        return f"--llm-{self.name}"

    @property
    def ini(self) -> str:
        return "llm_" + self.name.replace("-", "_")

    @property
    def dest(self) -> str:
        return "llm_" + self.name.replace("-", "_")


#: the presets (``--llm-preset``), as pyperf's --fast/--rigorous and hypothesis's settings
#: profiles: each sets the options that decide how long and how often a cell is measured, never
#: what is measured (the matrix, the output length); an option given anywhere (the command
#: line, the environment, the ini file) wins over its preset's value (docs/options.md)
PRESETS: dict[str, tuple[tuple[str, str], ...]] = {
    # a look at a server: short windows, one cold request, a miss measured again once
    "quick": (("duration", "10"), ("prefill-repeats", "1"), ("confirm", "1")),
    # a CI gate: windows that end once precise, six cold requests, a miss confirmed twice,
    # and 30 minutes to measure again what is undecided
    "gate": (
        ("duration", "30"),
        ("precision", "2%"),
        ("min-duration", "10"),
        ("prefill-repeats", "6"),
        ("confirm", "2"),
        ("budget", "30m"),
    ),
    # figures to publish: long windows until ±1 %, twelve cold requests, three confirmations
    "publish": (
        ("duration", "60"),
        ("precision", "1%"),
        ("min-duration", "30"),
        ("prefill-repeats", "12"),
        ("confirm", "3"),
    ),
}

OPTIONS: tuple[Option, ...] = (
    Option(
        "endpoint",
        "OpenAI-compatible URL or sim[:PROFILE]; several: replicas; none: plugin off",
        env=("LLMSPEED_ENDPOINT",),
        repeat=True,
    ),
    Option("model", "served model name (default: the server's first model)"),
    Option(
        "metrics-url",
        "the /metrics URL of each replica, where the endpoint has none (a router); "
        "comma-separated or repeated",
        repeat=True,
    ),
    Option(
        "api-key",
        "API key, sent as a Bearer token, never printed",
        env=("LLMSPEED_API_KEY", "OPENAI_API_KEY"),
    ),
    Option(
        "api",
        "which endpoint to measure: completions or chat",
        default="completions",
        choices=("completions", "chat"),
    ),
    Option(
        "tools",
        "chat requests must call a built-in function; the tool-call deltas are counted (needs "
        "--llm-api=chat)",
        default="false",
        switch=True,
    ),
    Option(
        "prompt-form",
        "send completions prompts as token ids or as text",
        default="ids",
        choices=("ids", "text"),
    ),
    Option(
        "contexts",
        "decode contexts, e.g. 8K,16K,max (K = 1024 tokens)",
        default=DEFAULT_CONTEXTS,
    ),
    Option(
        "prefill-contexts",
        "prefill contexts, also limit (max_model_len − 1) (default: the decode contexts)",
    ),
    Option(
        "concurrency",
        "requests in flight per decode cell",
        default=DEFAULT_CONCURRENCY,
    ),
    Option(
        "duration",
        "seconds of each decode window; live line unless -q or TERM=dumb; PYTEST_TIMEOUT cuts it",
        default="30",
    ),
    Option(
        "precision",
        "end a decode window early once its 95 % interval is within this fraction, e.g. 2% "
        "(default: off)",
    ),
    Option(
        "min-duration",
        "seconds a window lasts at least with --llm-precision",
        default="5",
    ),
    Option(
        "prefill-repeats",
        "cold requests per prefill cell, TTFT their median (default: 1; 6 with a baseline, 12 "
        "in an A/B)",
    ),
    Option("max-output", "max_tokens of every decode request", default="4096"),
    Option(
        "rates",
        "open-loop arrival rates (req/s), e.g. 0.5,2,8: a cell per context and rate",
    ),
    Option(
        "burstiness",
        "rate cells' gamma gap shape: 1 Poisson, below 1 burstier",
        default="1",
    ),
    Option("rate-seed", "seed of the rate cells' arrival times", default="0"),
    Option(
        "rate-prompts",
        "rate cells' prompts: shared (the context's warm prefix, returning users) or cold "
        "(each its own, new users)",
        default="shared",
        choices=("shared", "cold"),
    ),
    Option(
        "trace",
        "replay this request trace: Mooncake JSONL, Azure or BurstGPT CSV",
    ),
    Option("trace-speed", "replay --llm-trace this many times faster", default="1"),
    Option(
        "prompt-text",
        "make every prompt of this text: a UTF-8 text file or a .jsonl of prompts",
    ),
    Option("turns", "conversations of this many turns: a cell per context and concurrency"),
    Option("turn-tokens", "tokens of each turn's new message after the first", default="256"),
    Option("turn-output", "max_tokens of each answer of a conversation", default="256"),
    Option("think-time", "seconds between a conversation's turns", default="1"),
    Option(
        "client-processes",
        "client processes reading each decode cell's streams, or auto",
        default="1",
    ),
    Option(
        "slo",
        "objectives on decode cells, e.g. ttft_p90<=2s,tbt_p90<=50ms: goodput and capacity, gated",
    ),
    Option("kv-capacity", "KV-cache capacity in tokens (default: read from the server)"),
    Option("max-model-len", "max_model_len in tokens, where the server does not report it"),
    Option(
        "results",
        "write JSON results to this path after every cell; the summary also goes to "
        "GITHUB_STEP_SUMMARY",
    ),
    *(Option(o.key, f"write {o.help} to this path, rewritten after every cell") for o in OUTPUTS),
    Option(
        "requests",
        "write one JSON line per request of every decode and open-loop cell to this path, "
        "as each cell ends",
    ),
    Option("compare", "compare with an earlier results file: a verdict per cell"),
    Option(
        "meta",
        'what the server cannot tell, as KEY=VALUE, e.g. hardware="H200 NVL" (repeatable)',
        repeat=True,
    ),
    Option(
        "serve",
        "start the server with this command ({port}: a free port), stop it at the end; or a "
        "sim: spec",
    ),
    Option(
        "serve-timeout",
        "seconds --llm-serve waits for the server to answer",
        default="900",
    ),
    Option(
        "serve-log",
        "file for --llm-serve's output (default: llmspeed-serve.log by the results)",
    ),
    Option("launch-command", "how the server was started, recorded with its secrets redacted"),
    Option(
        "timeout",
        "seconds to wait for a connection, a token or an answer",
        default="120",
    ),
    Option(
        "max-error-rate",
        "failed-request fraction above which a decode cell fails",
        default="0.05",
    ),
    Option("baseline", "gate every measured cell on this baseline file (TOML)"),
    Option(
        "save-baseline",
        "write this run's cells as a baseline file (TOML); one of the same settings gets the "
        "run added",
    ),
    Option(
        "runs",
        "measure the matrix this many times, restarting the server, each run into "
        "--llm-save-baseline",
        default="1",
    ),
    Option(
        "baseline-strict",
        "a baseline of other settings or another model is an error, not a warning",
        default="false",
        switch=True,
    ),
    Option(
        "confirm",
        "times to re-measure a cell that misses its baseline",
        default="1",
    ),
    Option(
        "baseline-missing",
        "a baseline cell selected but not measured: fail or warn",
        default="fail",
        choices=("fail", "warn"),
    ),
    Option(
        "serve-baseline",
        "the old version's server command, for an A/B against --llm-serve",
    ),
    Option(
        "endpoint-baseline",
        "the old version's URL, for an A/B against --llm-endpoint (no restarts)",
    ),
    Option(
        "ab-rounds",
        "the most rounds of an A/B, in blocks of four",
        default="16",
    ),
    Option("ab-seed", "seed of the blocks' order, to repeat an A/B (default: a fresh one)"),
    Option(
        "ab-prior",
        "pool the spread between starts with these earlier A/Bs' results files",
    ),
    Option(
        "tolerance",
        "the change a verdict tolerates, e.g. 5% or 0.05",
        default="5%",
    ),
    Option("budget", "the most time spent measuring again: 900, 90s, 10m, 1h (default: no limit)"),
    Option(
        "unknown",
        "a cell too noisy to judge: warn (the run passes) or fail",
        default="warn",
        choices=("warn", "fail"),
    ),
    Option(
        "preset",
        "set the measuring options at once: quick, gate or publish; options given win "
        "(docs/options.md)",
        choices=tuple(PRESETS),
    ),
    Option(
        "builtin-suite",
        "run the built-in matrix: auto (when asked for: docs/measure.md), always or never",
        default="auto",
        choices=("auto", "always", "never"),
    ),
)

#: ``pytest --help``'s groups, in order: a title and its options' names (every option in one;
#: one left out lands in "llmspeed: other"); the full text of each is in docs/options.md
HELP_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "connection",
        (
            "endpoint",
            "metrics-url",
            "model",
            "api-key",
            "api",
            "prompt-form",
            "timeout",
            "kv-capacity",
            "max-model-len",
        ),
    ),
    (
        "matrix",
        (
            "preset",
            "contexts",
            "prefill-contexts",
            "concurrency",
            "duration",
            "precision",
            "min-duration",
            "prefill-repeats",
            "max-output",
            "client-processes",
            "builtin-suite",
        ),
    ),
    (
        "workloads",
        (
            "rates",
            "burstiness",
            "rate-seed",
            "rate-prompts",
            "trace",
            "trace-speed",
            "turns",
            "turn-tokens",
            "turn-output",
            "think-time",
            "prompt-text",
            "tools",
        ),
    ),
    (
        "gate",
        (
            "baseline",
            "save-baseline",
            "baseline-strict",
            "baseline-missing",
            "confirm",
            "tolerance",
            "budget",
            "unknown",
            "max-error-rate",
            "slo",
        ),
    ),
    ("A/B", ("serve-baseline", "endpoint-baseline", "ab-rounds", "ab-seed", "ab-prior")),
    ("outputs", ("results", *(o.key for o in OUTPUTS), "requests", "compare", "meta")),
    ("launch", ("serve", "serve-log", "serve-timeout", "runs", "launch-command")),
)


@dataclass(frozen=True)
class Settings:
    endpoint: str  # the first endpoint (or the simulator spec)
    endpoints: tuple[str, ...] = ()  # every endpoint, when several (the replicas of one model)
    metrics_urls: tuple[str, ...] = ()
    model: str | None = None
    api_key: Secret | None = field(default=None, repr=False)  # revealed in the header only
    api: str = "completions"
    tools: bool = False  # --llm-tools: chat requests offer a function the answer must call
    prompt_form: str = "ids"
    contexts: tuple[int | str, ...] = ()
    prefill_contexts: tuple[int | str, ...] = ()
    concurrency: tuple[int, ...] = ()
    duration: float = 30.0
    precision: float | None = None
    min_duration: float = 5.0
    prefill_repeats: int = 1
    max_output: int = 4096
    #: open-loop cells (docs/workloads.md): arrival rates (requests/s), their gaps' gamma
    #: shape and seed; a trace (core.openloop.Trace, read at configure time) and its speed
    rates: tuple[float, ...] = ()
    burstiness: float = 1.0
    rate_seed: int = 0
    rate_prompts: str = "shared"  # or "cold": each rate request a prompt of its own
    trace: Any = None
    trace_speed: float = 1.0
    #: --llm-prompt-text's material (core.prompt_text.PromptText, read at configure time)
    prompt_text: Any = None
    #: conversation cells (docs/workloads.md, "Conversations"): turns (None: no cell), the new
    #: message's tokens, the answers' max_tokens, the seconds between turns
    turns: int | None = None
    turn_tokens: int = 256
    turn_output: int = 256
    think_time: float = 1.0
    client_processes: int | str = 1  # or "auto"
    slo: tuple[Any, ...] = ()  # gate.slo.Bound: --llm-slo's objectives
    kv_capacity: int | None = None
    max_model_len: int | None = None
    results: str | None = None
    requests: str | None = None  # --llm-requests: one JSON line per request
    timeout: float = 120.0
    max_error_rate: float = 0.05
    baseline: str | None = None
    save_baseline: str | None = None
    runs: int = 1
    baseline_strict: bool = False
    confirm: int = 1
    baseline_missing: str = "fail"
    #: the registered outputs asked for (report/outputs.py), each with its path
    outputs: tuple[tuple[Output, str], ...] = ()
    compare: str | None = None
    meta: tuple[tuple[str, str], ...] = ()
    launch_command: str | None = None
    serve: str | None = field(default=None, repr=False)  # as given: secrets included
    serve_timeout: float = 900.0
    serve_log: str | None = None
    builtin_suite: str = "auto"
    notes: tuple[str, ...] = ()  # what the settings decided that the user should know
    serve_plan: Any = None  # core.launch.ServeCommand when --llm-serve was given
    #: the A/B (issue 31): the old version's command and its plan, or its endpoint
    serve_baseline: str | None = field(default=None, repr=False)  # as given: secrets included
    serve_baseline_plan: Any = None
    endpoint_baseline: str | None = None
    ab_rounds: int = 16
    ab_seed: int | None = None  # None: drawn when the A/B begins
    #: --llm-ab-prior: earlier A/Bs read (gate.prior.PriorFile each)
    ab_prior: tuple[Any, ...] = ()
    tolerance: float = 0.05
    #: --llm-tolerance was given (command line, environment or ini file): it then stands for
    #: the stored gate's default tolerance too, and is written into a baseline saved with it
    tolerance_given: bool = False
    #: proxy variables set in the environment, which the plugin does not use, in words
    proxy_note: str | None = None
    preset: str | None = None  # --llm-preset
    preset_note: str | None = None  # what it set, for the header
    budget: float | None = None  # seconds
    unknown: str = "warn"

    @property
    def is_sim(self) -> bool:
        return self.endpoint == "sim" or self.endpoint.startswith("sim:")

    @property
    def effective_prompt_form(self) -> str:
        """What the prompts are sent as: chat prompts are always text."""
        return "text" if self.api == "chat" else self.prompt_form

    def public(self) -> dict[str, Any]:
        """Settings as plain data for reports, without secrets."""
        return {
            "api": self.api,
            "tools": self.tools,
            "prompt_form": self.effective_prompt_form,
            "contexts": [str(c) for c in self.contexts],
            "prefill_contexts": [str(c) for c in self.prefill_contexts],
            "concurrency": list(self.concurrency),
            "duration_s": self.duration,
            "precision": self.precision,
            "min_duration_s": self.min_duration if self.precision is not None else None,
            "prefill_repeats": self.prefill_repeats,
            "max_output": self.max_output,
            "rates": list(self.rates) or None,
            "burstiness": self.burstiness if self.rates else None,
            "rate_seed": self.rate_seed if self.rates else None,
            "rate_prompts": self.rate_prompts if self.rates else None,
            "trace": self.trace.source if self.trace is not None else None,
            "trace_speed": self.trace_speed if self.trace is not None else None,
            "prompt_text": self.prompt_text.source if self.prompt_text is not None else None,
            "turns": self.turns,
            "turn_tokens": self.turn_tokens if self.turns else None,
            "turn_output": self.turn_output if self.turns else None,
            "think_time_s": self.think_time if self.turns else None,
            "client_processes": self.client_processes,
            "slo": slo_text(self.slo) if self.slo else None,
            "kv_capacity_option": self.kv_capacity,
            "max_model_len_option": self.max_model_len,
            "timeout_s": self.timeout,
            "max_error_rate": self.max_error_rate,
            "baseline": self.baseline,
            "confirm": self.confirm,
            "preset": self.preset,
            "runs": self.runs,
            "baseline_missing": self.baseline_missing,
            "api_key": "<redacted>" if self.api_key else None,
            "ab": self.ab_kind,
            "ab_rounds": self.ab_rounds if self.ab_kind else None,
            "ab_prior": [p.path for p in self.ab_prior] or None,
            "tolerance": self.tolerance if self.ab_kind else None,
            "budget_s": self.budget,
            "unknown": self.unknown,
        }

    @property
    def ab_kind(self) -> str | None:
        """``serve`` (old and new started by the plugin), ``endpoints`` (two servers it does
        not start), or None: no A/B."""
        if self.serve_baseline is not None:
            return "serve"
        if self.endpoint_baseline is not None:
            return "endpoints"
        return None


def slo_text(bounds: tuple[Any, ...]) -> str:
    from ..gate.slo import text

    return text(bounds)


def add_options(parser: pytest.Parser) -> None:
    """The options in ``pytest --help``'s groups (HELP_GROUPS), each help a line or two; the
    ini twins' help one line (docs/options.md has the full text of each)."""
    by_name = {o.name: o for o in OPTIONS}
    grouped = {name for _, names in HELP_GROUPS for name in names}
    groups = [*HELP_GROUPS, ("other", tuple(o.name for o in OPTIONS if o.name not in grouped))]
    for i, (title, names) in enumerate(groups):
        if not names:
            continue
        name = f"llmspeed: {title}"
        group = parser.getgroup(name, f"{name} (every option: docs/options.md)" if i == 0 else "")
        for opt_name in names:
            _add_option(parser, group, by_name[opt_name])


def _add_option(parser: pytest.Parser, group: pytest.OptionGroup, opt: Option) -> None:
    # argparse formats help with %: a literal one is %%
    extra = f" [env: {', '.join(opt.env)}]" if opt.env else ""
    default = f" (default: {opt.default})" if opt.default else ""
    if opt.repeat:
        group.addoption(
            opt.flag,
            dest=opt.dest,
            action="append",
            default=None,
            help=(opt.help + extra).replace("%", "%%"),
        )
        parser.addini(opt.ini, help=f"as {opt.flag}, one value a line", type="linelist", default=[])
        return
    if opt.switch:
        group.addoption(
            opt.flag,
            dest=opt.dest,
            action="store_const",
            const="true",
            default=None,
            help=(opt.help + extra).replace("%", "%%"),
        )
        parser.addini(opt.ini, help=f"as {opt.flag}: true or false{default}", default=None)
        return
    group.addoption(
        opt.flag, dest=opt.dest, default=None, help=(opt.help + default + extra).replace("%", "%%")
    )
    parser.addini(opt.ini, help=f"as {opt.flag}{default}", default=None)


def raw_values(config: pytest.Config, opt: Option) -> list[tuple[str, str]]:
    """A repeatable option's values, each with where it came from: the ini file's lines, then
    the command line's (a later KEY wins)."""
    ini = [(str(v), f"ini key {opt.ini}") for v in config.getini(opt.ini) or [] if str(v).strip()]
    cli = [(str(v), opt.flag) for v in config.getoption(opt.dest, None) or []]
    return ini + cli


def raw_value(config: pytest.Config, opt: Option) -> tuple[str | None, str]:
    """The winning value and where it came from (for error messages)."""
    cli = config.getoption(opt.dest, None)
    if cli is not None:
        return str(cli), opt.flag
    for var in opt.env:
        if os.environ.get(var):
            return os.environ[var], f"environment variable {var}"
    ini = config.getini(opt.ini)
    if ini not in (None, "", []):
        return str(ini).strip(), f"ini key {opt.ini}"
    if opt.name != "preset":
        preset = preset_of(config)
        if preset is not None and opt.name in dict(PRESETS[preset]):
            return dict(PRESETS[preset])[opt.name], f"--llm-preset={preset}"
    return opt.default, f"{opt.flag} default"


def preset_of(config: pytest.Config) -> str | None:
    """The preset the run asked for (None: none, or a name that is none: ``load`` says so)."""
    opt = next(o for o in OPTIONS if o.name == "preset")
    name, _ = raw_value(config, opt)
    return name if name in PRESETS else None


def preset_words(config: pytest.Config) -> str | None:
    """The header's line of the preset: what it set, and what was given instead."""
    preset = preset_of(config)
    if preset is None:
        return None
    took, given = [], []
    for name, value in PRESETS[preset]:
        opt = next(o for o in OPTIONS if o.name == name)
        got, source = raw_value(config, opt)
        if source.startswith("--llm-preset"):
            took.append(f"{opt.flag}={value}")
        else:
            given.append(f"{opt.flag}={got} ({source})")
    line = f"preset {preset}: " + (" ".join(took) or "nothing left to set")
    return line + (f"; given instead: {', '.join(given)}" if given else "")


def url_values(config: pytest.Config, opt: Option) -> tuple[list[str], str]:
    """A list-of-URLs option's values (the option repeated, comma-separated, or one per line in
    the ini file) and where they came from: the command line wins over the environment, which
    wins over the ini file. A simulator spec is one value (its options may hold commas)."""
    cli = config.getoption(opt.dest, None)
    raw: list[str]
    if cli:
        raw, source = [str(v) for v in cli], opt.flag
    elif any(os.environ.get(v) for v in opt.env):
        var = next(v for v in opt.env if os.environ.get(v))
        raw, source = [os.environ[var]], f"environment variable {var}"
    else:
        raw, source = [str(v) for v in config.getini(opt.ini) or []], f"ini key {opt.ini}"
    out: list[str] = []
    for value in raw:
        value = value.strip()
        if value == "sim" or value.startswith("sim:"):
            out.append(value)
        else:
            out.extend(part.strip() for part in value.split(",") if part.strip())
    return out, source


def endpoint_of(config: pytest.Config) -> str | None:
    """The endpoint the user gave, or the server command that will provide one: without
    either, the plugin stays inactive."""
    values, _ = url_values(config, OPTIONS[0])
    serve = next(o for o in OPTIONS if o.name == "serve")
    return (values[0] if values else None) or raw_value(config, serve)[0] or None


def _refused(config: pytest.Config, name: str, why: str) -> pytest.UsageError:
    """The usage error for option ``name``'s winning value, named where it came from."""
    opt = next(o for o in OPTIONS if o.name == name)
    given, source = raw_value(config, opt)
    return _bad(source, str(given), why)


def _bad(source: str, value: str, why: str) -> pytest.UsageError:
    from ..core.text import redact_known

    return pytest.UsageError(redact_known(f"{source}={value!r}: {why}"))


def load(config: pytest.Config) -> Settings:
    """Validate every option; a bad value raises ``pytest.UsageError`` naming it."""
    from ..core.matrix import MatrixError

    values: dict[str, Any] = {}
    for opt in OPTIONS:
        key = opt.dest[4:]
        if key in ("endpoint", "metrics_url"):
            continue  # lists of URLs: _endpoints()
        if opt.repeat:
            values[key] = _meta(raw_values(config, opt))
            continue
        value, source = raw_value(config, opt)
        if value is None:
            values[key] = None
            continue
        if opt.choices and value not in opt.choices:
            raise _bad(source, value, f"choose one of {', '.join(opt.choices)}")
        try:
            values[key] = _convert(key, value)
        except (ValueError, MatrixError) as exc:
            raise _bad(source, value, str(exc)) from None
    for key in ("serve", "serve_baseline"):  # a simulator spec: the command that starts it
        given = values.get(key)
        if isinstance(given, str) and (given == "sim" or given.startswith("sim:")):
            from ..sim import serve_command

            try:
                values[key] = serve_command(given)
            except ValueError as exc:
                raise _refused(config, key.replace("_", "-"), str(exc)) from None
    notes: list[str] = []
    _endpoints(config, values, notes)
    if values["serve"] is not None:
        _derive_endpoint(config, values, notes)
    min_duration = values["min_duration"] or 5.0
    min_source = raw_value(config, next(o for o in OPTIONS if o.name == "min-duration"))[1]
    if min_source.startswith("--llm-preset") and min_duration > (values["duration"] or 30.0):
        notes.append(
            f"--llm-min-duration: the preset's {min_duration:g} s is longer than the window "
            f"given, {values['duration']:g} s: the window's length is its least too"
        )
        values["min_duration"] = min_duration = values["duration"]  # a window given shorter
    if values["precision"] is not None and min_duration > (values["duration"] or 30.0):
        raise _refused(
            config,
            "min-duration",
            f"is longer than --llm-duration ({values['duration'] or 30.0:g} s): a window "
            "that may end early must be allowed to: lower it, or raise --llm-duration",
        )
    if values["precision"] is not None and values["client_processes"] not in (None, 1):
        raise _refused(
            config,
            "client-processes",
            "cannot go with --llm-precision: its early end needs the tokens while they arrive, "
            "and other processes read them; use one client process, or no --llm-precision",
        )
    if (values["runs"] or 1) > 1:
        opt = next(o for o in OPTIONS if o.name == "runs")
        given, source = raw_value(config, opt)
        if values["save_baseline"] is None:
            raise _bad(
                source,
                str(given),
                "needs --llm-save-baseline=FILE: each run is added to that baseline",
            )
        endpoint = values["endpoint"] or ""
        if values["serve"] is None and not (endpoint == "sim" or endpoint.startswith("sim:")):
            raise _bad(
                source,
                str(given),
                "needs a server the plugin starts (--llm-serve, or --llm-endpoint=sim...), to "
                "restart it between runs; against a server you start, run the same command "
                "once per start with --llm-save-baseline",
            )
    if values["rates"]:
        from ..core.openloop import MAX_RATE_REQUESTS

        most = max(values["rates"]) * (values["duration"] or 30.0)
        if most > MAX_RATE_REQUESTS:
            raise _refused(
                config,
                "rates",
                f"{max(values['rates']):g}/s for --llm-duration {values['duration'] or 30.0:g} s "
                f"is about {most:,.0f} requests, more than {MAX_RATE_REQUESTS:,} in one cell: "
                "lower the rate or the duration",
            )
    _check_ab(config, values)
    if values["tools"] and (values["api"] or "completions") != "chat":
        raise _refused(
            config,
            "tools",
            "tool calls are a chat answer's: give --llm-api=chat too (completions have none)",
        )
    if values["prefill_repeats"] is None:
        ab = values["serve_baseline"] is not None or values["endpoint_baseline"] is not None
        gate = values["baseline"] or values["save_baseline"] or (values["runs"] or 1) > 1
        values["prefill_repeats"] = (
            AB_PREFILL_REPEATS if ab else GATED_PREFILL_REPEATS if gate else 1
        )
    if values["prefill_contexts"] is None:
        values["prefill_contexts"] = values["contexts"]
    paths = {o.key: values.pop(o.dest) for o in OUTPUTS}
    values["outputs"] = tuple((o, paths[o.key]) for o in OUTPUTS if paths[o.key] is not None)
    files = {
        k: values[k.replace("-", "_")]
        for k in ("results", "requests", "save-baseline", "serve-log")
    }
    for name, path in (files | paths).items():
        if path is not None:
            opt = next(o for o in OPTIONS if o.name == name)
            problem = unwritable(path)
            if problem:
                raise _bad(raw_value(config, opt)[1], path, problem)
    plan = values.pop("serve_plan", None)
    tolerance = next(o for o in OPTIONS if o.name == "tolerance")
    values["tolerance_given"] = not raw_value(config, tolerance)[1].endswith(" default")
    rounds = next(o for o in OPTIONS if o.name == "ab-rounds")
    if values["budget"] is not None and raw_value(config, rounds)[1].endswith(" default"):
        values["ab_rounds"] = BUDGET_ROUNDS  # the budget, not a cap set before, decides
    values["preset_note"] = preset_words(config)
    settings = Settings(**{k: v for k, v in values.items() if v is not None})
    return dataclasses.replace(settings, notes=tuple(notes), serve_plan=plan)


def _endpoints(config: pytest.Config, values: dict[str, Any], notes: list[str]) -> None:
    """--llm-endpoint (one URL, several replicas, or the simulator) and --llm-metrics-url,
    checked: each a URL, none twice, the simulator alone, a metrics URL per endpoint."""
    from .server import public_url  # a refused URL is shown as every line shows the server

    urls, source = url_values(config, OPTIONS[0])
    endpoints: list[str] = []
    for url in urls:
        url = url.rstrip("/")
        if url == "sim" or url.startswith("sim:"):
            if len(urls) > 1:
                raise _bad(
                    source,
                    ",".join(urls),
                    "the simulator is one endpoint: for simulated replicas give "
                    "'sim:PROFILE?replicas=2'",
                )
        elif not url.startswith(("http://", "https://")):
            raise _bad(
                source,
                url,
                "use a URL such as http://127.0.0.1:8000, or 'sim' for the built-in simulator",
            )
        elif problem := _url_problem(url, query=False):
            raise _bad(source, public_url(url), problem)
        elif url.endswith("/v1"):
            # the base URL as the OpenAI SDK and server docs write it: the same server
            url = url.removesuffix("/v1")
            notes.append(
                f"--llm-endpoint ends in /v1, the API's path: measuring the server at {url}"
            )
        if url in endpoints:
            raise _bad(source, url, "given twice: each replica once")
        endpoints.append(url)
    values["endpoint"] = endpoints[0] if endpoints else None
    values["endpoints"] = tuple(endpoints) if len(endpoints) > 1 else None
    proxies = sorted(v for v in os.environ if v.lower() in PROXY_VARIABLES and os.environ[v])
    if endpoints and proxies:
        values["proxy_note"] = (
            f"{', '.join(proxies)} set and not used: the plugin connects to the server "
            "directly (through a proxy, the proxy's own time would be measured as the server's)"
        )
        notes.append(values["proxy_note"])
    opt = next(o for o in OPTIONS if o.name == "metrics-url")
    metrics, msource = url_values(config, opt)
    for url in metrics:
        if not url.startswith(("http://", "https://")):
            raise _bad(msource, public_url(url), "use a URL such as http://10.0.0.5:8000/metrics")
        if problem := _url_problem(url, query=True):
            raise _bad(msource, public_url(url), problem)
    if metrics and len(endpoints) > 1 and len(metrics) != len(endpoints):
        raise _bad(
            msource,
            ",".join(metrics),
            f"{len(metrics)} metrics URL(s) for {len(endpoints)} endpoints: give one per "
            "endpoint, in the same order (or one endpoint, a router, with one per replica "
            "behind it)",
        )
    values["metrics_urls"] = tuple(metrics) or None


#: the environment's proxy settings, which the plugin does not use (aiohttp's trust_env off)
PROXY_VARIABLES = frozenset(("http_proxy", "https_proxy", "all_proxy"))
#: query parameters that carry a secret (a gateway's ``?api_key=``, ``?token=``)
_SECRET_PARAMS = frozenset(
    ("key", "api_key", "apikey", "api-key", "token", "access_token", "auth", "password", "secret")
)


def _url_problem(url: str, query: bool) -> str | None:
    """Why a server URL is refused: credentials in it (its user and password, or a key in its
    query string, which every line naming the server would print), or, for the endpoint
    (``query=False``), any query string or fragment (the API's paths go after the base URL)."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        return "holds credentials (user:password@): give the key with --llm-api-key"
    names = {k.lower() for k, _ in parse_qsl(parts.query, keep_blank_values=True)}
    if names & _SECRET_PARAMS:
        return "holds a key in its query string: give it with --llm-api-key"
    if not query and (parts.query or parts.fragment):
        return (
            "has a query string or fragment (?…, #…): give the server's base URL, such as "
            "http://127.0.0.1:8000"
        )
    return None


def _rank(source: str) -> int:
    """Where a value came from, as its precedence: the command line (0) wins over the
    environment (1), which wins over the ini file (2)."""
    if source.startswith("environment"):
        return 1
    return 2 if source.startswith("ini key") else 0


def _derive_endpoint(config: pytest.Config, values: dict[str, Any], notes: list[str]) -> None:
    """--llm-serve: plan the command (its port), and make the endpoint the local server. An
    endpoint from a place of lower precedence than the command's (the ini file's, under
    --llm-serve on the command line) gives way to it, with a note."""
    from ..core.launch import LaunchError, plan

    serve = next(o for o in OPTIONS if o.name == "serve")
    source = raw_value(config, serve)[1]
    try:
        command = plan(values["serve"])
    except LaunchError as exc:
        raise _bad(source, values["serve"], exc.message) from None
    given = values["endpoint"]
    esource = url_values(config, OPTIONS[0])[1]
    if given is not None and _rank(source) < _rank(esource):
        notes.append(
            f"{source} starts the server: the endpoint of {esource} ({given}) is not measured"
        )
        values["endpoints"] = None
        given = None
    where = "" if esource == OPTIONS[0].flag else f" (from {esource})"
    if values.get("endpoints"):
        raise _bad(
            source,
            values["serve"],
            f"starts one server, but --llm-endpoint{where} names several: give one of the two",
        )
    if given is not None:
        host = urlsplit(given).hostname if given.startswith("http") else None
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise _bad(
                source,
                values["serve"],
                f"starts a server on this machine, but --llm-endpoint={given}{where} is another "
                "one: give one of the two",
            )
    values["endpoint"] = command.url
    values["serve_plan"] = command


def _check_ab(config: pytest.Config, values: dict[str, Any]) -> None:
    """The A/B's options make sense together: the old command beside --llm-serve, or the old
    endpoint beside one --llm-endpoint; no stored baseline, no --llm-runs."""
    from ..core.launch import LaunchError, plan

    old_serve, old_url = values["serve_baseline"], values["endpoint_baseline"]
    if old_serve is None and old_url is None:
        if values.get("ab_prior"):
            opt = next(o for o in OPTIONS if o.name == "ab-prior")
            given, source = raw_value(config, opt)
            raise _bad(
                source,
                str(given),
                "is for an A/B: give --llm-serve-baseline (or --llm-endpoint-baseline) too",
            )
        return
    name = "serve-baseline" if old_serve is not None else "endpoint-baseline"
    opt = next(o for o in OPTIONS if o.name == name)
    given, source = raw_value(config, opt)
    assert given is not None

    def bad(why: str) -> pytest.UsageError:
        return _bad(source, given, why)

    if old_serve is not None and old_url is not None:
        raise bad("give the old version once: its command or its endpoint, not both")
    for other in ("baseline", "save_baseline"):
        if values[other] is not None:
            flag = "--llm-" + other.replace("_", "-")
            raise bad(
                f"an A/B measures old and new now, alternately: it cannot go with {flag} "
                "(a baseline measured some other time); drop one of the two"
            )
    if (values["runs"] or 1) > 1:
        raise bad("an A/B runs its own rounds: drop --llm-runs")
    if old_serve is not None:
        if values["serve"] is None:
            raise bad("needs --llm-serve=NEW_COMMAND: the new version's command, to alternate with")
        try:
            values["serve_baseline_plan"] = plan(old_serve)
        except LaunchError as exc:
            raise bad(exc.message) from None
    else:
        url = old_url.rstrip("/").removesuffix("/v1")
        if not url.startswith(("http://", "https://")):
            raise bad("use a URL such as http://127.0.0.1:8001: the old version's server")
        if values["serve"] is not None or values["endpoint"] is None:
            raise bad(
                "needs --llm-endpoint=URL (the new version's server, one the plugin does not "
                "start); to start both, give --llm-serve and --llm-serve-baseline"
            )
        if values.get("endpoints") or values["endpoint"].startswith("sim"):
            raise bad("needs one --llm-endpoint URL (not replicas, not the simulator)")
        if url == values["endpoint"]:
            raise bad("is the same server as --llm-endpoint: give the old version's URL")
        values["endpoint_baseline"] = url
    if (values["ab_rounds"] or 16) < 8:
        opt = next(o for o in OPTIONS if o.name == "ab-rounds")
        raise _bad(
            raw_value(config, opt)[1],
            str(values["ab_rounds"]),
            "an A/B needs at least 8 rounds (two blocks of old, new, new, old): the spread "
            "of one block's change is not known",
        )


#: an A/B's most rounds under --llm-budget when --llm-ab-rounds is not given: the budget
#: decides when to stop (100 blocks: a bound only against a budget of days)
BUDGET_ROUNDS = 400


def parse_duration(value: str) -> float:
    """``900``, ``90s``, ``10m``, ``1h``, ``1.5h`` → seconds (positive, finite)."""
    text = value.strip().lower()
    why = "give seconds, or a number with a unit: 900, 90s, 10m, 1h"
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}
    factor = 1.0
    if text and text[-1] in scale:
        text, factor = text[:-1].strip(), scale[text[-1]]
    number = _float(text, why) * factor
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"must be a positive duration: {why}")
    return number


def _meta(items: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` items → pairs (quotes around a value dropped; secrets redacted; the sizes
    the bandwidth bound reads checked)."""
    out: dict[str, str] = {}
    for item, source in items:
        from ..core.bandwidth import check_meta  # imported only when there is meta
        from ..core.errors import redact_secrets

        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise _bad(source, item, 'give KEY=VALUE, e.g. hardware="H200 NVL"')
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        try:
            check_meta({key.strip(): value})
        except ValueError as exc:
            raise _bad(source, item, str(exc).partition(": ")[2]) from None
        out[key.strip()] = redact_secrets(f"{key.strip()}={value}").partition("=")[2]
    return tuple(out.items())


def unwritable(path: str) -> str | None:
    """Why a file cannot be written at ``path`` (its folder is created if it does not exist
    yet), or None. Checked before any cell runs, so a run never measures for nothing."""
    target = Path(path)
    if target.is_dir():
        return "is a folder: give a file name"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".llmspeed-check-"):
            pass
    except OSError as exc:
        return f"cannot write there ({exc.strerror or exc}): choose a writable path"
    return None


#: the most turns a conversation cell may have (each turn is a request per user)
MAX_TURNS = 1000


def _convert(key: str, value: str) -> Any:
    from ..core.matrix import parse_concurrency, parse_contexts
    from ..core.text import register, secret

    if key in ("contexts", "prefill_contexts"):
        return tuple(parse_contexts(value, prefill=key == "prefill_contexts"))
    if key == "concurrency":
        return tuple(parse_concurrency(value))
    if key == "precision":
        return _precision(value)
    if key == "rates":
        return _rates(value)
    if key in ("burstiness", "trace_speed"):
        number = _float(value, "must be a positive number")
        if not (math.isfinite(number) and 0 < number <= 1000):
            raise ValueError("must be a positive number (at most 1000)")
        return number
    if key == "rate_seed":
        if not value.strip().isdigit():
            raise ValueError("must be a whole number (0, 1, 2, ...)")
        return int(value)
    if key == "trace":
        from ..core.openloop import TraceError, read_trace

        try:
            return read_trace(value)
        except TraceError as exc:  # its words name the file: the option's name is added
            raise ValueError(exc.message.removeprefix(value + ": ")) from None
    if key == "prompt_text":
        from ..core.prompt_text import PromptTextError, read_prompt_text

        try:
            return read_prompt_text(value)
        except PromptTextError as exc:  # its words name the file: the option's name is added
            raise ValueError(exc.message.removeprefix(value + ": ")) from None
    if key in ("duration", "timeout", "serve_timeout", "min_duration"):
        number = _float(value, "must be a positive number of seconds")
        if not math.isfinite(number) or number <= 0:
            raise ValueError("must be a positive number of seconds")
        return number
    if key == "max_error_rate":
        number = _float(value, "must be a fraction between 0 and 1")
        if not 0 <= number <= 1:
            raise ValueError("must be a fraction between 0 and 1")
        return number
    if key == "client_processes":
        if value.strip().lower() == "auto":
            return "auto"
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError("must be a whole number of processes ≥ 1, or auto")
        return int(value)
    if key == "prefill_repeats":
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError("must be a whole number of requests ≥ 1")
        return int(value)
    if key == "turns":
        if not value.strip().isdigit() or not 1 <= int(value) <= MAX_TURNS:
            raise ValueError(f"must be a whole number of turns from 1 to {MAX_TURNS}")
        return int(value)
    if key == "think_time":
        number = _float(value, "must be a number of seconds ≥ 0")
        if not (math.isfinite(number) and 0 <= number <= 3600):
            raise ValueError("must be a number of seconds from 0 to 3600")
        return number
    if key in ("max_output", "kv_capacity", "max_model_len", "turn_tokens", "turn_output"):
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError("must be a whole number of tokens ≥ 1")
        return int(value)
    if key in ("baseline_strict", "tools"):
        if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError("must be true or false")
        return value.lower() in ("true", "1", "yes")
    if key == "runs":
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError("must be a whole number of runs ≥ 1")
        return int(value)
    if key == "ab_rounds":
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError("must be a whole number of rounds (8 or more)")
        return int(value)
    if key == "ab_prior":
        from ..gate.prior import PriorError, read_prior

        paths = [v.strip() for v in value.split(",") if v.strip()]
        if not paths:
            raise ValueError("give one or more results files of earlier A/Bs, comma-separated")
        try:
            return tuple(read_prior(path) for path in paths)
        except PriorError as exc:
            raise ValueError(str(exc)) from None
    if key == "ab_seed":
        if not value.strip().isdigit():
            raise ValueError("must be a whole number (0, 1, 2, ...)")
        return int(value)
    if key == "tolerance":
        text = value.strip()
        why = "give a percentage or a fraction, e.g. 5% or 0.05"
        number = _float(text[:-1], why) / 100 if text.endswith("%") else _float(text, why)
        if not (math.isfinite(number) and 0 < number < 1):
            raise ValueError(f"must be above 0 and below 100 %: {why}")
        return number
    if key == "budget":
        return parse_duration(value)
    if key == "serve_baseline":
        from ..core.errors import secret_values

        for found in secret_values(value):  # the command's own keys and tokens
            register(found)
        return value
    if key == "confirm":
        if not value.strip().isdigit():
            raise ValueError("must be a whole number of extra measurements (0, 1, 2, ...)")
        return int(value)
    if key == "slo":
        from ..gate.slo import parse

        return parse(value)  # SLOError (a ValueError): one line, what is valid
    if key == "api_key":
        return secret(value)  # a Secret from here on, registered: redacted from every text
    if key == "serve":
        from ..core.errors import secret_values

        for found in secret_values(value):  # the command's own keys and tokens
            register(found)
        return value
    if key == "launch_command":
        from ..core.errors import redact_secrets

        return redact_secrets(value.strip())
    return value


def _rates(value: str) -> tuple[float, ...]:
    """``0.5,2,8`` → (0.5, 2.0, 8.0): positive request rates, each once, as a cell id writes
    them (at most 6 decimals)."""
    from ..results import rate_label

    why = "give requests per second, comma-separated, e.g. 0.5,2,8"
    out: list[float] = []
    for part in value.split(","):
        if not part.strip():
            continue
        number = _float(part.strip(), why)
        if not (math.isfinite(number) and 0.001 <= number <= 10_000):
            raise ValueError(f"{part.strip()} is not a rate from 0.001 to 10,000/s: {why}")
        number = float(rate_label(number))
        if number in out:
            raise ValueError(f"{part.strip()} is given twice: {why}")
        out.append(number)
    if not out:
        raise ValueError(why)
    return tuple(out)


def _precision(value: str) -> float:
    """``2%`` or ``0.02`` → 0.02; a fraction in (0, 0.5]."""
    text = value.strip()
    why = "give the interval's half-width as a percentage or a fraction, e.g. 2% or 0.02"
    number = _float(text[:-1], why) / 100 if text.endswith("%") else _float(text, why)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"must be above 0: {why}")
    if number > 0.5:
        raise ValueError(
            "is wider than ±50 %, which no window needs to reach: " + why
            if text.endswith("%")
            else f"is {number:g}, read as a fraction (±{number:.0%}): {why}"
        )
    return number


def _float(value: str, why: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(why) from None
