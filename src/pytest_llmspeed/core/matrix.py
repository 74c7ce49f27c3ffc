"""The context × concurrency matrix: parsing, cell ids, capacity arithmetic and skip reasons."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..contexts import LIMIT, MAX, K, context_label, display_label

if TYPE_CHECKING:  # the results model is imported when a cell is skipped, not when options are read
    from ..results import Status

__all__ = [
    "LIMIT",
    "MAX",
    "Limits",
    "MatrixError",
    "Skip",
    "context_label",
    "decode_skip",
    "display_label",
    "exceeds_max_model_len",
    "normalize_context",
    "over_capacity",
    "parse_concurrency",
    "parse_contexts",
    "resolve_context",
]

_CONTEXT_RE = re.compile(r"^(\d+(?:\.\d+)?)([kK]?)$")


class MatrixError(ValueError):
    """A matrix option value that cannot be parsed."""


def parse_contexts(text: str, prefill: bool = False) -> list[int | str]:
    """``"8K,16K,max"`` → ``[8192, 16384, "max"]``. K is 1024 tokens. ``prefill``: the
    contexts of prefill cells, which may also be ``limit`` (the largest prompt the server
    accepts with one output token)."""
    out: list[int | str] = []
    for raw in _split(text):
        item = raw.strip()
        if item.lower() == LIMIT and not prefill:
            raise MatrixError(
                "'limit' is a prefill context (the largest prompt the server accepts with one "
                "output token): a decode cell needs room for its output, use 'max'; or give "
                "limit in --llm-prefill-contexts"
            )
        if item.lower() in (MAX, LIMIT):
            value: int | str = item.lower()
        else:
            m = _CONTEXT_RE.match(item)
            if not m:
                raise MatrixError(
                    f"context {item!r} is not a token count: use a number of tokens (8192), "
                    "a K multiple (8K = 8192 tokens), 'max'" + (" or 'limit'" if prefill else "")
                )
            number = float(m.group(1)) * (K if m.group(2) else 1)
            if number != int(number) or number < 1:
                raise MatrixError(f"context {item!r} is not a whole, positive number of tokens")
            value = int(number)
        if value not in out:
            out.append(value)
    if not out:
        raise MatrixError("no context given: use for example 8K,16K,32K,max")
    return out


def parse_concurrency(text: str) -> list[int]:
    """``"1,2,4"`` → ``[1, 2, 4]``."""
    out: list[int] = []
    for raw in _split(text):
        item = raw.strip()
        if not item.isdigit() or int(item) < 1:
            raise MatrixError(
                f"concurrency {item!r} is not a whole number of requests ≥ 1 (e.g. 1,2,4,8)"
            )
        if int(item) not in out:
            out.append(int(item))
    if not out:
        raise MatrixError("no concurrency given: use for example 1,2,4,8")
    return out


def normalize_context(context: int | str) -> int | str:
    """A context as a test parameter may be given as ``"32K"``: make it ``32768``."""
    if isinstance(context, str):
        return parse_contexts(context, prefill=True)[0]
    return context


def _split(text: str) -> list[str]:
    return [part for part in text.replace(" ", "").split(",") if part]


def resolve_context(context: int | str, max_model_len: int | None, max_output: int) -> int | None:
    """Tokens of a context; ``max`` is the largest prompt that fits with the output budget,
    ``limit`` the largest with one output token (max_model_len − 1)."""
    if context not in (MAX, LIMIT):
        return int(context)
    if max_model_len is None:
        return None
    return max_model_len - (1 if context == LIMIT else max_output)


@dataclass(frozen=True)
class Limits:
    """What the server can hold: both may be unknown (``None``). With several replicas of one
    model, ``kv_capacity`` is one replica's (the smallest) and N streams are spread over
    ``replicas``."""

    kv_capacity: int | None
    max_model_len: int | None
    replicas: int = 1


@dataclass(frozen=True)
class Skip:
    """Why a cell is not run, decided by arithmetic before any request: its status and the
    reason with the arithmetic."""

    status: Status
    reason: str


def exceeds_max_model_len(context: int, max_output: int, limits: Limits) -> Skip | None:
    """Skip when C + M > max_model_len, else ``None``."""
    from ..results import Status

    if limits.max_model_len is None or context + max_output <= limits.max_model_len:
        return None
    return Skip(
        Status.DOES_NOT_FIT,
        f"exceeds max_model_len: {display_label(context)} + {max_output} = "
        f"{context + max_output:,} > max_model_len {limits.max_model_len:,}",
    )


def over_capacity(context: int, concurrency: int, max_output: int, limits: Limits) -> Skip | None:
    """Skip when N × (C + M) > KV capacity, else ``None``. Over several replicas, when
    ceil(N / replicas) × (C + M) > the KV capacity of one replica (the smallest): the streams
    are spread evenly, so the busiest replica holds ceil(N / replicas) of them."""
    from ..results import Status

    if limits.kv_capacity is None:
        return None
    per = math.ceil(concurrency / limits.replicas)  # streams on the busiest replica
    need = per * (context + max_output)
    if need <= limits.kv_capacity:
        return None
    size = f"({display_label(context)} + {max_output})"
    if limits.replicas == 1:
        arithmetic = f"{concurrency} × {size} = {need:,} > KV capacity"
    else:
        arithmetic = (
            f"ceil({concurrency} / {limits.replicas} replicas) × {size} = {per} × "
            f"{context + max_output:,} = {need:,} > KV capacity of one replica"
        )
    return Skip(Status.OVER_CAPACITY, f"Over capacity: {arithmetic} {limits.kv_capacity:,}")


def decode_skip(context: int, concurrency: int, max_output: int, limits: Limits) -> Skip | None:
    """Why a decode cell cannot run (too long first, then over capacity), or ``None``."""
    return exceeds_max_model_len(context, max_output, limits) or over_capacity(
        context, concurrency, max_output, limits
    )
