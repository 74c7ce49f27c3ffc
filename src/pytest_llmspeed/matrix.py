"""The context × concurrency matrix: parsing, cell ids, capacity arithmetic and skip reasons."""

from __future__ import annotations

import re
from dataclasses import dataclass

K = 1024
MAX = "max"

_CONTEXT_RE = re.compile(r"^(\d+(?:\.\d+)?)([kK]?)$")


class MatrixError(ValueError):
    """A matrix option value that cannot be parsed."""


def parse_contexts(text: str) -> list[int | str]:
    """``"8K,16K,max"`` → ``[8192, 16384, "max"]``. K is 1024 tokens."""
    out: list[int | str] = []
    for raw in _split(text):
        item = raw.strip()
        if item.lower() == MAX:
            value: int | str = MAX
        else:
            m = _CONTEXT_RE.match(item)
            if not m:
                raise MatrixError(
                    f"context {item!r} is not a token count: use a number of tokens (8192), "
                    "a K multiple (8K = 8192 tokens) or 'max'"
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
        return parse_contexts(context)[0]
    return context


def _split(text: str) -> list[str]:
    return [part for part in text.replace(" ", "").split(",") if part]


def context_label(context: int | str) -> str:
    """Readable label: 8192 → ``8K``, 1500 → ``1500``, ``max`` stays ``max``."""
    if context == MAX or isinstance(context, str):
        return str(context)
    if context % K == 0:
        return f"{context // K}K"
    return str(context)


def display_label(tokens: int) -> str:
    """Label for a resolved length in tables: exact K multiples as ``8K``, others rounded down."""
    if tokens % K == 0 or tokens >= 10 * K:
        return f"{tokens // K}K"
    return f"{tokens:,}"


def resolve_context(context: int | str, max_model_len: int | None, max_output: int) -> int | None:
    """Tokens of a context; ``max`` is the largest prompt that fits with the output budget."""
    if context != MAX:
        return int(context)
    if max_model_len is None:
        return None
    return max_model_len - max_output


def cell_id(context: int | str, concurrency: int | None = None) -> str:
    """The parameter id: ``32K`` for a prefill cell, ``32K-c8`` for a decode cell."""
    label = context_label(context)
    return label if concurrency is None else f"{label}-c{concurrency}"


@dataclass(frozen=True)
class Limits:
    """What the server can hold: both may be unknown (``None``)."""

    kv_capacity: int | None
    max_model_len: int | None


def exceeds_max_model_len(context: int, max_output: int, limits: Limits) -> str | None:
    """Skip reason when C + M > max_model_len, else ``None``."""
    if limits.max_model_len is None or context + max_output <= limits.max_model_len:
        return None
    return (
        f"exceeds max_model_len: {display_label(context)} + {max_output} = "
        f"{context + max_output:,} > max_model_len {limits.max_model_len:,}"
    )


def over_capacity(context: int, concurrency: int, max_output: int, limits: Limits) -> str | None:
    """Skip reason when N × (C + M) > KV capacity, else ``None``."""
    if limits.kv_capacity is None:
        return None
    need = concurrency * (context + max_output)
    if need <= limits.kv_capacity:
        return None
    return (
        f"Over capacity: {concurrency} × ({display_label(context)} + {max_output}) = "
        f"{need:,} > KV capacity {limits.kv_capacity:,}"
    )


def decode_skip_reason(
    context: int, concurrency: int, max_output: int, limits: Limits
) -> str | None:
    """Why a decode cell cannot run (too long first, then over capacity), or ``None``."""
    return exceeds_max_model_len(context, max_output, limits) or over_capacity(
        context, concurrency, max_output, limits
    )
