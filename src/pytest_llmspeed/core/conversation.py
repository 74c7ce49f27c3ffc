"""Conversation cells (docs/workloads.md, "Conversations"): U users, each a conversation of T
turns whose prompt is every earlier turn (prompts and answers) plus a new user message, the
users in step so that the server's prefix-cache counters read around a turn are that turn's.

The pure parts first: the cell's id (:func:`conversation_id`), each user's own tokens
(:func:`user_tokens`), what a stream said of its answer (:func:`parse_answer`), the share of a
prompt the server should find cached (:func:`expected_cached`), a turn's figures
(:func:`turn_figures`); then the I/O: the cell (:func:`run_conversations`). No pytest here.

Prompts are token ids (``/v1/completions``): the earlier prompt is carried as the very ids
that were sent, so a turn's history of prompts is exact; the answer's part is the server's
own ids (``return_token_ids``) where every chunk gave them and their count is the server's
``usage.completion_tokens``, else the answer's text tokenized by the server's ``/tokenize``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..contexts import context_label
from .client import Connection, StreamRecord, account_tokens, stream_request
from .errors import KeyRejected, LLMSpeedError, MalformedAnswer
from .prompts import PromptFactory, material_piece
from .server_figures import ServerFigures
from .status import CellStatus
from .wire import DONE, Dialect, _choice_output, loads, request_fields, shown

#: token ids a server may name (a larger id, a negative one or a boolean is refused)
MAX_TOKEN_ID = 2**31 - 1
#: how an answer fed the next turn (the cell's ``answers`` note)
OWN_IDS = "token ids"
TOKENIZED = "tokenized text"


def conversation_id(context: int, users: int, turns: int) -> str:
    """The cell's id inside ``conversation[...]``: ``8K-u4-t3`` (the first turn's prompt, the
    users, the turns)."""
    return f"{context_label(context)}-u{users}-t{turns}"


def user_tokens(
    salt: int, pool: Sequence[int], user: int, turn: int, n: int, text: list[int] | None = None
) -> list[int]:
    """``n`` token ids of user ``user``'s message at turn ``turn``, drawn from ``pool`` (the
    server's own ids) by a generator seeded with the run's salt, the user and the turn: the
    same three, the same tokens; no two users, turns or runs share them (but by chance). With
    ``text`` (``--llm-prompt-text``'s token ids): a slice of it after 4 salted ids
    (:func:`~.prompts.material_piece`)."""
    if text is not None:
        return material_piece(f"{salt}:conv:{user}:{turn}", list(pool), text, n)
    seed = int.from_bytes(hashlib.sha256(f"{salt}:conv:{user}:{turn}".encode()).digest()[:8])
    rng = np.random.default_rng(seed)
    ids = np.asarray(pool)[rng.integers(0, len(pool), n)]
    return [int(i) for i in ids.tolist()]


def block_size_from_metrics(
    samples: dict[str, list[tuple[dict[str, str], float]]] | None,
) -> int | None:
    """The server's KV block size in tokens from parsed ``/metrics``: vLLM's
    ``cache_config_info{block_size}``, the same on every engine; None when it is not there,
    not a whole number of tokens, or the engines differ."""
    from .probe import _label_tokens

    infos = (samples or {}).get("vllm:cache_config_info") or (samples or {}).get(
        "vllm:cache_config_info_info"
    )
    sizes = {_label_tokens(labels.get("block_size")) for labels, _ in infos or ()}
    if len(sizes) != 1:
        return None
    return sizes.pop()


@dataclass(frozen=True)
class Answer:
    """What a stream said of its answer: the text, joined, and the token ids every chunk with
    output carried (None where one carried none, or an id was not one)."""

    text: str
    token_ids: tuple[int, ...] | None
    id_note: str | None = None  # why the ids are None, when a chunk sent ids that are not ids


def _ids_of(choice: dict[str, object]) -> tuple[list[int] | None, str | None]:
    value = choice.get("token_ids")
    if value is None:
        return None, None
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_TOKEN_ID for i in value
    ):
        return None, f"choices[].token_ids is {shown(value)}, not a list of token ids"
    return value, None


def parse_answer(reads: Sequence[tuple[float, bytes]]) -> Answer:
    """The answer of a completions stream from its raw reads: each ``data:`` event's choices'
    text, joined, and their ``token_ids`` (vLLM's ``return_token_ids``) where every choice that
    carried output carried ids. The stream's shapes are checked as everywhere
    (:class:`~.errors.MalformedAnswer` for a choice that is not one); the events after
    ``[DONE]`` are not read. Pure."""
    data = b"".join(d for _, d in reads).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    text: list[str] = []
    ids: list[int] | None = []
    note: str | None = None
    for event in data.split(b"\n\n"):
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == DONE:
                return Answer("".join(text), None if ids is None else tuple(ids), note)
            try:
                obj = loads(payload)
            except ValueError:
                raise MalformedAnswer("stream", "sent an event that is not JSON") from None
            choices = obj.get("choices") if isinstance(obj, dict) else None
            if not isinstance(choices, list):
                continue
            for c in choices:
                piece, carries, *_ = _choice_output(c)
                text.append(piece)
                got, bad = _ids_of(c)
                note = note or bad
                if got is None:
                    if carries:
                        ids = None  # output without its ids: the ids are not the answer's
                elif ids is not None:
                    ids += got
    return Answer("".join(text), None if ids is None else tuple(ids), note)


def expected_cached(
    prompt: int, prev_prompt: int | None, prev_answer: int | None, block: int
) -> int:
    """Prompt tokens a prefix cache of ``block``-token blocks should hit in a turn of
    ``prompt`` tokens whose history is the previous turn's prompt of ``prev_prompt`` tokens
    (None at turn 1: nothing) and, where the server caches the blocks its answers filled, that
    turn's answer of ``prev_answer`` tokens (None: prompts cached only). Only whole blocks
    count, and not the block of a prompt's last token (a server computes at least that one);
    an answer's last token is sampled, not computed, so not cached. Pure."""
    if prev_prompt is None or block <= 0:
        return 0
    held = prev_prompt if prev_answer is None else prev_prompt + prev_answer - 1
    return block * min(held // block, (prompt - 1) // block)


@dataclass(frozen=True)
class Sent:
    """One request of a turn: the user, what was sent and what it saw."""

    user: int
    prompt_tokens: int  # P_k as sent
    prev_prompt: int | None  # P_{k-1}; None at turn 1
    prev_answer: int | None  # A_{k-1} as carried, where the answer's own ids were
    max_tokens: int
    rec: StreamRecord


@dataclass(frozen=True)
class TurnFigures:
    """The figures of one turn index over the users whose conversation reached it
    (docs/workloads.md, "Figures of a conversation cell"): per user samples, and the
    server's prefix cache over the turn."""

    turn: int
    users: int
    prompt_tokens: tuple[int, ...]  # as sent, per user
    new_tokens: tuple[int, ...]
    ttft_ms: tuple[float, ...]  # per user with a first token
    new_prefill_tok_s: tuple[float, ...]
    output_tok_s: tuple[float, ...]  # per user with ≥ 2 tokens
    failed: int
    early_stops: int
    wrong_lengths: dict[int, int]
    expected_tokens: int | None  # Σ expected cached, prompts cached (None: block unknown)
    expected_answer_tokens: int | None  # ... answers cached too (None: not every id carried)
    hits: int | None  # the server's Δ prefix_cache_hits over the turn
    queries: int | None  # ... Δ prefix_cache_queries

    @property
    def hit_rate(self) -> float | None:
        if self.hits is None or not self.queries:
            return None
        return self.hits / self.queries

    @property
    def expected_hit_share(self) -> float | None:
        total = sum(self.prompt_tokens)
        return None if self.expected_tokens is None or not total else self.expected_tokens / total

    @property
    def expected_hit_share_answers(self) -> float | None:
        total = sum(self.prompt_tokens)
        if self.expected_answer_tokens is None or not total:
            return None
        return self.expected_answer_tokens / total

    def median(self, name: str) -> float | None:
        values: tuple[float, ...] = getattr(self, name)
        return float(np.median(values)) if values else None

    def as_dict(self) -> dict[str, object]:
        """The turn as the results file's ``turns`` entry (medians; None where none)."""
        return {
            "turn": self.turn,
            "users": self.users,
            "prompt_tokens": round(float(np.median(self.prompt_tokens)))
            if self.prompt_tokens
            else None,
            "new_tokens": round(float(np.median(self.new_tokens))) if self.new_tokens else None,
            "ttft_ms": self.median("ttft_ms"),
            "new_prefill_tok_s": self.median("new_prefill_tok_s"),
            "output_tok_s": self.median("output_tok_s"),
            "hit_rate": self.hit_rate,
            "expected_hit_share": self.expected_hit_share,
            "expected_hit_share_answers": self.expected_hit_share_answers,
            "early_stops": self.early_stops,
            "failed": self.failed,
        }


def turn_figures(
    turn: int,
    sent: Sequence[Sent],
    block: int | None,
    server: ServerFigures | None = None,
) -> TurnFigures:
    """The figures of turn ``turn`` from its requests (their streams read, tokens accounted),
    the server's KV block size ``block`` (None: unknown, no expected share) and the server's
    figures read before and after the turn. Pure."""
    ttft: list[float] = []
    prefill: list[float] = []
    out_rate: list[float] = []
    wrong: dict[int, int] = {}
    failed = early = 0
    expected = 0
    answers: int | None = 0
    for s in sent:
        rec = s.rec
        new = s.prompt_tokens - (s.prev_prompt or 0)
        if rec.prompt_tokens is not None and rec.prompt_tokens != s.prompt_tokens:
            wrong[rec.prompt_tokens] = wrong.get(rec.prompt_tokens, 0) + 1
        if rec.t_first is not None and rec.t_first > rec.t_send:
            t = rec.t_first - rec.t_send
            ttft.append(t * 1e3)
            prefill.append(new / t)
        n = rec.n_tokens
        if n >= 2 and len(rec.token_times) and rec.token_times[-1] > rec.token_times[0]:
            out_rate.append((n - 1) / (rec.token_times[-1] - rec.token_times[0]))
        if rec.error:
            failed += 1
        elif n < s.max_tokens:
            early += 1
        if block is not None:
            expected += expected_cached(s.prompt_tokens, s.prev_prompt, None, block)
            if answers is not None and (s.prev_prompt is None or s.prev_answer is not None):
                answers += expected_cached(s.prompt_tokens, s.prev_prompt, s.prev_answer, block)
            else:
                answers = None
    hits = server.prefix_cache_hits if server is not None else None
    queries = server.prefix_cache_queries if server is not None else None
    return TurnFigures(
        turn=turn,
        users=len(sent),
        prompt_tokens=tuple(s.prompt_tokens for s in sent),
        new_tokens=tuple(s.prompt_tokens - (s.prev_prompt or 0) for s in sent),
        ttft_ms=tuple(ttft),
        new_prefill_tok_s=tuple(prefill),
        output_tok_s=tuple(out_rate),
        failed=failed,
        early_stops=early,
        wrong_lengths=wrong,
        expected_tokens=expected if block is not None else None,
        expected_answer_tokens=answers if block is not None else None,
        hits=hits,
        queries=queries,
    )


@dataclass
class ConversationResult:
    """What a conversation cell measured: each turn's figures, turn 1 first, and its notes
    (conversations that ended, how answers fed the next turn)."""

    turns: list[TurnFigures]
    notes: list[str] = field(default_factory=list)
    answers: str | None = None  # OWN_IDS, TOKENIZED, or both joined: how answers were carried
    sent: list[list[Sent]] = field(default_factory=list, repr=False)

    def _later(self) -> list[TurnFigures]:
        return [t for t in self.turns if t.turn >= 2]

    @property
    def conv_ttft_ms(self) -> float | None:
        """Median TTFT of every request of turns 2 … T (those that should hit the cache)."""
        values = [v for t in self._later() for v in t.ttft_ms]
        return float(np.median(values)) if values else None

    @property
    def conv_hit_rate(self) -> float | None:
        """The server's prefix-cache hits / queries over turns 2 … T."""
        later = self._later()
        if not later or any(t.hits is None or t.queries is None for t in later):
            return None
        queries = sum(t.queries or 0 for t in later)
        return sum(t.hits or 0 for t in later) / queries if queries else None

    @property
    def conv_expected_hit_share(self) -> float | None:
        """The prompts-cached expected share over turns 2 … T."""
        later = self._later()
        if not later or any(t.expected_tokens is None for t in later):
            return None
        total = sum(sum(t.prompt_tokens) for t in later)
        return sum(t.expected_tokens or 0 for t in later) / total if total else None


def conversation_status(result: ConversationResult, max_error_rate: float) -> CellStatus:
    """Valid, or failed (prompts the server counted at another length than sent; more failed
    requests than ``max_error_rate``), as an open-loop cell's; an error when no turn ran."""
    from ..results import Status

    wrong: dict[int, int] = {}
    for t in result.turns:
        for k, v in t.wrong_lengths.items():
            wrong[k] = wrong.get(k, 0) + v
    if wrong:
        return CellStatus(
            Status.FAILED,
            "the server counted other prompt lengths than those sent: "
            + ", ".join(f"{k:,} ({v}×)" for k, v in sorted(wrong.items())),
            "prompt_form",
        )
    requests = sum(t.users for t in result.turns)
    failed = sum(t.failed for t in result.turns)
    if requests and failed / requests > max_error_rate:
        return CellStatus(
            Status.FAILED,
            f"{failed} of {requests} requests failed "
            f"({failed / requests:.0%} > max_error_rate {max_error_rate:g})",
            "max_error_rate",
        )
    if not result.turns:
        ended = next(iter(result.notes), "no conversation had a turn")
        return CellStatus(Status.ERROR, ended)
    return CellStatus(Status.VALID)


def _ended(user: int, turn: int, turns: int, prompt: int, answer: int, limit: int) -> str:
    where = "before its first turn" if turn == 1 else f"after turn {turn - 1} of {turns}"
    return (
        f"user {user + 1}'s conversation ended {where}: turn {turn}'s "
        f"prompt of {prompt:,} tokens + {answer:,} output > the server's max_model_len "
        f"{limit:,}"
    )


async def run_conversations(
    conn: Connection,
    factory: PromptFactory,
    dialect: Dialect,
    model: str,
    context: int,
    users: int,
    turns: int,
    message_tokens: int,
    answer_tokens: int,
    think_s: float,
    *,
    max_model_len: int | None = None,
    block_size: int | None = None,
    return_token_ids: bool = False,
    watch_metrics: bool = True,
    keep_reads: bool = False,
) -> ConversationResult:
    """Run ``users`` conversations of ``turns`` turns in step: turn 1 a prompt of ``context``
    token ids of each user's own, each later turn the previous prompt, its answer and a new
    message of ``message_tokens``; answers of ``answer_tokens``; ``think_s`` seconds between
    turns. ``/metrics`` is read before and after each turn (``watch_metrics``): the turn's
    prefix-cache hits and queries. ``return_token_ids`` asks the server for its answers' ids
    (vLLM's ``return_token_ids``); where a stream did not give them all, the answer's text is
    tokenized by the server. A conversation whose next turn does not fit ``max_model_len``
    ends, said in the notes; a failed request ends its user's conversation. Each stream's raw
    reads are dropped once its answer is read (``keep_reads``: kept, for tests that compare
    the wire with a server's record), so memory stays that of the prompts."""
    from .protocol import EDGE_FAMILIES, _read
    from .protocol import _window_figures as window

    if not factory.uses_ids:
        raise LLMSpeedError(
            "a conversation needs token-id prompts (each turn's history must be the earlier "
            f"turns exactly), and this run sends "
            f"{'chat messages' if factory.api == 'chat' else 'text'}",
            setting="prompt_form" if factory.api == "completions" else "api",
        )
    pool = await factory.id_pool()
    tokenizer = factory.tokenizer
    fields = request_fields(model, answer_tokens, dialect)
    if return_token_ids:
        fields["return_token_ids"] = True
    rest = json.dumps(fields)[1:].encode()
    text = await factory.material_ids(context)  # --llm-prompt-text: messages of the text
    prompts: dict[int, list[int]] = {
        u: user_tokens(factory.salt, pool, u, 1, context, text) for u in range(users)
    }
    prev: dict[int, tuple[int | None, int | None]] = {u: (None, None) for u in range(users)}
    result = ConversationResult([])
    modes: set[str] = set()
    for turn in range(1, turns + 1):
        talking = []
        for u in sorted(prompts):
            p = len(prompts[u])
            if max_model_len is not None and p + answer_tokens > max_model_len:
                result.notes.append(_ended(u, turn, turns, p, answer_tokens, max_model_len))
                continue
            talking.append(u)
        for u in set(prompts) - set(talking):
            del prompts[u]
        if not talking:
            break
        if turn > 1 and think_s > 0:
            await asyncio.sleep(think_s)
        bodies = {
            u: b"".join((b'{"prompt": [', ", ".join(map(str, prompts[u])).encode(), b"], ", rest))
            for u in talking
        }
        read_open = await _read(conn) if watch_metrics else None
        sent = [
            Sent(u, len(prompts[u]), *prev[u], answer_tokens, StreamRecord(keep_reads=True))
            for u in talking
        ]
        tasks = [
            asyncio.ensure_future(stream_request(conn, dialect.path, bodies[s.user], s.rec))
            for s in sent
        ]
        try:
            ended = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for t in tasks:
                t.cancel()
        for outcome in ended:
            if isinstance(outcome, KeyRejected):
                raise outcome
        for outcome in ended:
            if isinstance(outcome, BaseException):
                raise outcome
        read_close = await _read(conn) if watch_metrics else None
        server = None
        if read_open is not None and read_close is not None:
            server = window(
                read_open.parse(EDGE_FAMILIES)[1], read_close.parse(EDGE_FAMILIES)[1], []
            )
        for s in sent:
            account_tokens(s.rec, answer_tokens)
        result.turns.append(turn_figures(turn, sent, block_size, server))
        result.sent.append(sent)
        if turn == turns:
            if not keep_reads:
                for s in sent:
                    s.rec.reads.clear()
            break
        for s in sent:  # the next turn's prompts
            u = s.user
            if s.rec.error:
                result.notes.append(
                    f"user {u + 1}'s conversation ended at turn {turn}: {s.rec.error}"
                )
                del prompts[u]
                continue
            answer = parse_answer(s.rec.reads)
            ids = answer.token_ids
            own = (
                return_token_ids
                and ids is not None
                and s.rec.completion_tokens is not None
                and len(ids) == s.rec.completion_tokens
            )
            if own:
                assert ids is not None
                carried = list(ids)
                modes.add(OWN_IDS)
            else:
                carried = await tokenizer.ids(answer.text) if answer.text else []
                modes.add(TOKENIZED)
            if answer.id_note and answer.id_note not in result.notes:
                result.notes.append(answer.id_note)
            if not keep_reads:
                s.rec.reads.clear()
            prev[u] = (s.prompt_tokens, len(carried) if own else None)
            prompts[u] = (
                prompts[u]
                + carried
                + user_tokens(factory.salt, pool, u, turn + 1, message_tokens, text)
            )
    result.answers = " and ".join(sorted(modes)) if modes else None
    if result.answers:
        result.notes.append(f"answers: {result.answers}")
    return result
