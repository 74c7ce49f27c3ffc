"""What a reader must know about a decode cell's figures, grouped by kind for the summaries.

Each kind is said once, with the cells it concerns and each cell's own figure:

    fewer requests in flight than asked: ... (late restarts or failing requests):
    decode[8K-c1] (0.81 of 1 on average, −19.0%), decode[8K-c2] (1.62 of 2 on average, −19.0%)

(one line in the terminal). A cell's own row (the page's "All measurements") gets the short
form: ``queued: 11.2 < 16``.
Pure functions of :class:`~pytest_llmspeed.results.CellRecord` s, of their figures and their
typed flags (``CellRecord.flags``), never of a note's text; the terminal summary, the Markdown
step summary and the page render what :func:`by_kind` returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..core.intervals import LITTLE_TOLERANCE, counter_gap, drift_noted
from ..results import CellRecord, FlagKind, Phase

#: token accountings that are estimates: the counter's disagreement fails such a cell
ESTIMATED = ("chunk-count", "ratio", "tokenize")


@dataclass(frozen=True)
class NoteKind:
    heading: str  # said once, before the cells it concerns
    short: str  # in a cell's own row


QUEUED = NoteKind(
    "the server queued requests (effective concurrency below the requests asked)", "queued"
)
CHUNK_COUNT = NoteKind(
    "ONE TOKEN PER CHUNK ASSUMED: an estimate (no usage in stream, no request finished at "
    "max_tokens)",
    "≈ one token per chunk",
)
TOKENS_ESTIMATED = NoteKind(
    "tokens estimated (the stream did not give every request's count)", "tokens estimated"
)
EARLY_STOPS = NoteKind("requests ended before max output", "ended before max output")
UNSTABLE = NoteKind("unstable: per-second throughput varies by more than 10 %", "unstable")
ENDED_EARLY = NoteKind("window ended early, precise enough (--llm-precision)", "ended early")
PRECISION_NOT_REACHED = NoteKind(
    "window ran to its end without the precision asked (--llm-precision)",
    "precision not reached",
)
DRIFT = NoteKind(
    "drift: total tok/s moved over the window (a trend, not noise), and the figure with it: "
    "it depends on where the window ended",
    "drift",
)
IN_FLIGHT = NoteKind(
    "fewer requests in flight than asked: the client did not keep them in flight "
    "(late restarts or failing requests)",
    "in flight",
)
COUNTER_LAG = NoteKind(
    "the server's generation counter rose more than the tokens received, no other client on "
    "the server, by less than the requests open at the window's close could still send: it "
    "counts tokens before it streams them (a lagging API server); the figures are the tokens "
    "received",
    "counter lag",
)
COUNTER_EARLY = NoteKind(
    "the server's generation counter rose less over the window than the tokens received, by "
    "less than the requests open at its start could have generated before it: tokens "
    "generated before the window opened, streamed inside it; the figures are the tokens "
    "received",
    "counter behind",
)
CLIENT_BEHIND = NoteKind(
    "the client could not keep up: its event loop was more than 50 ms behind for over a tenth "
    "of the window, so reads were stamped late and the figures are partly the client's (a "
    "server this fast: --llm-client-processes=auto; or this machine's other work)",
    "client behind",
)
SERVER_BUSY = NoteKind(
    "the server was busy at the window's start (requests running or waiting after a wait of "
    "at most 10 s): the cell ran; its figures are the client's, and the queue and counter "
    "notes say whether another load shows in them",
    "server busy",
)
METRICS_UNPARSED = NoteKind(
    "/metrics did not parse: no server figures from that read", "/metrics did not parse"
)
SERVER_VALUES = NoteKind(
    "server values that are not figures (NaN, infinite or negative): those series are taken "
    "as not exposed in the cell",
    "server values refused",
)
SERVER_WENT_BACK = NoteKind(
    "the server's counters went back inside the window (it restarted, or its counters are not "
    "to be trusted): the cell's server figures are not kept",
    "server figures not kept",
)
USAGE_BEFORE_TOKENS = NoteKind(
    "usage counted tokens before the chunk that carried them (a usage-only chunk first): each "
    "request's first token is its first chunk that carries one, so the count moved no clock",
    "usage before tokens",
)
HELD_AFTER_DONE = NoteKind(
    "the server held streams open after their data: [DONE]: each request ended at its [DONE] "
    "(not in flight while held), the stream closed by the client",
    "held after [DONE]",
)
NOT_REFEREED = NoteKind(
    "not refereed: the server has a generation counter, but /metrics gave none at the "
    "window's edges (slow, unparsed or without it): the tokens received were not checked "
    "against the server's count",
    "not refereed",
)
NOT_RECOUNTED = NoteKind(
    "usage not re-counted: the server's tokenizer failed on the text received, so the usage "
    "was not checked against the text the streams carried",
    "not re-counted",
)
SEVERAL_MODELS = NoteKind(
    "the streams named several models: several backends behind one endpoint, whose figures "
    "the cell mixes",
    "several models",
)
#: the order kinds are said in
KINDS = (
    CLIENT_BEHIND,
    SERVER_BUSY,
    QUEUED,
    CHUNK_COUNT,
    TOKENS_ESTIMATED,
    EARLY_STOPS,
    UNSTABLE,
    ENDED_EARLY,
    PRECISION_NOT_REACHED,
    DRIFT,
    IN_FLIGHT,
    COUNTER_LAG,
    COUNTER_EARLY,
    METRICS_UNPARSED,
    SERVER_VALUES,
    SERVER_WENT_BACK,
    USAGE_BEFORE_TOKENS,
    HELD_AFTER_DONE,
    NOT_REFEREED,
    NOT_RECOUNTED,
    SEVERAL_MODELS,
)
#: the kinds a cell's flags give (``CellRecord.flags``), said after the kinds from its figures
_FROM_FLAGS = {
    FlagKind.METRICS_UNPARSED: METRICS_UNPARSED,
    FlagKind.SERVER_VALUES_REFUSED: SERVER_VALUES,
    FlagKind.SERVER_WENT_BACK: SERVER_WENT_BACK,
    FlagKind.USAGE_BEFORE_TOKENS: USAGE_BEFORE_TOKENS,
    FlagKind.HELD_AFTER_DONE: HELD_AFTER_DONE,
    FlagKind.NOT_REFEREED: NOT_REFEREED,
    FlagKind.NOT_RECOUNTED: NOT_RECOUNTED,
    FlagKind.MODELS: SEVERAL_MODELS,
}
#: kinds a cell's own row only names (its flags' words, shown beside, say the rest)
_NAMED = (SERVER_BUSY, METRICS_UNPARSED, SERVER_VALUES, SERVER_WENT_BACK)
#: flags a cell's own row says in full in its note (:func:`cell_flags`), not again in words
SAID_IN_ROW = frozenset({FlagKind.CLIENT_BEHIND})


def _flag_details(c: CellRecord, kind: FlagKind) -> list[str]:
    return [f.detail for f in c.flags if f.kind == kind]


@dataclass(frozen=True)
class CellNote:
    kind: NoteKind
    detail: str = ""  # this cell's figure ('' when the kind says it all)


def cell_notes(c: CellRecord) -> list[CellNote]:
    """The notes of one decode cell, in the order of :data:`KINDS` (none for a prefill cell)."""
    if c.phase is not Phase.DECODE:
        return []
    notes = [CellNote(CLIENT_BEHIND, d) for d in _flag_details(c, FlagKind.CLIENT_BEHIND)]
    notes += [CellNote(SERVER_BUSY, d) for d in _flag_details(c, FlagKind.SERVER_BUSY)]
    if c.queued:
        notes.append(CellNote(QUEUED, f"{c.effective_concurrency} < {c.concurrency}"))
    if c.tokens == "chunk-count":
        notes.append(CellNote(CHUNK_COUNT))
    elif c.tokens in ("ratio", "tokenize"):
        notes += [CellNote(TOKENS_ESTIMATED, d) for d in _flag_details(c, FlagKind.TOKENS)]
    if c.early_stops:
        notes.append(CellNote(EARLY_STOPS, str(c.early_stops)))
    cv = c.stability_cv or 0.0
    if cv > 0.1:  # a tenth is shown where whole percents would say 10 %
        notes.append(CellNote(UNSTABLE, f"{cv:.0%}" if round(cv, 2) > 0.1 else f"{cv:.1%}"))
    if c.window_end == "precision" and c.precision is not None:
        notes.append(CellNote(ENDED_EARLY, f"±{c.precision:.1%} after {c.measured_s or 0:.1f} s"))
    elif c.window_end == "duration" and c.precision is not None:
        notes.append(
            CellNote(PRECISION_NOT_REACHED, f"±{c.precision:.1%} at {c.measured_s or 0:g} s")
        )
    if drift_noted(
        c.drift,
        c.total_tok_s,
        c.total_tok_s_ci,
        c.measured_s,
        c.duration_s,
        early_end=c.precision is not None,
    ):
        assert c.drift is not None
        way = "fell" if c.drift < 0 else "rose"
        notes.append(CellNote(DRIFT, f"{way} {abs(c.drift):.1%}"))
    if c.little_residual is not None and abs(c.little_residual) > LITTLE_TOLERANCE:
        held = c.concurrency * (1 + c.little_residual)
        notes.append(
            CellNote(
                IN_FLIGHT,
                f"{held:.2f} of {c.concurrency} on average, {c.little_residual:+.1%}".replace(
                    "-", "−"
                ),
            )
        )
    gap = counter_gap(c.generation_tokens_delta, c.received_span, c.concurrency or 1)
    refuted = (c.reason or "").startswith("the server's generation counter")  # failed for it
    if gap is not None and not refuted and c.tokens not in ESTIMATED:
        kind = COUNTER_LAG if gap > 0 else COUNTER_EARLY
        notes.append(CellNote(kind, f"{gap:+.1%}".replace("-", "−")))
    for flag_kind, kind in _FROM_FLAGS.items():
        notes += [CellNote(kind, d) for d in _flag_details(c, flag_kind)]
    return notes


def cell_flags(c: CellRecord) -> list[str]:
    """A cell's notes in short, for its own row: ``queued: 11.2 < 16``, ``drift: fell 2.3%``.
    An estimate of tokens is only named (the cell's notes say how it was made)."""
    named = (TOKENS_ESTIMATED, CHUNK_COUNT, *_NAMED)
    return [
        n.kind.short if n.kind in named else f"{n.kind.short}: {n.detail}" for n in cell_notes(c)
    ]


def row_notes(c: CellRecord) -> list[str]:
    """What a cell's own row says of it: its notes in short (:func:`cell_flags`), its flags in
    words (but those the short form says in full), then its other notes."""
    words = [f.text() for f in c.flags if f.kind not in SAID_IN_ROW]
    return [*cell_flags(c), *words, *c.notes]


def by_kind(cells: Iterable[CellRecord]) -> list[tuple[NoteKind, list[tuple[str, str]]]]:
    """Each kind that concerns some cell, once, with those cells: (id, detail), in order."""
    found: dict[NoteKind, list[tuple[str, str]]] = {}
    for c in cells:
        for n in cell_notes(c):
            found.setdefault(n.kind, []).append((str(c.id), n.detail))
    return [(kind, found[kind]) for kind in KINDS if kind in found]


def which(concerned: list[tuple[str, str]], quote: str = "") -> str:
    """``decode[8K-c1] (0.81 of 1 on average), decode[8K-c2] (…)``."""
    return ", ".join(
        f"{quote}{cid}{quote}" + (f" ({detail})" if detail else "") for cid, detail in concerned
    )


def note_lines(cells: Iterable[CellRecord], indent: str = "  ") -> list[str]:
    """The summary's notes on cells: one line per kind, ``heading: the cells (their figure)``."""
    return [f"{indent}{kind.heading}: {which(concerned)}" for kind, concerned in by_kind(cells)]
