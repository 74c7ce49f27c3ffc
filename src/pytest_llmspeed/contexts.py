"""Contexts as the options, the cell ids and the tables name them: ``K``, ``max``, ``limit``,
their labels (``8K``). Shared by the results model and the matrix arithmetic, and light: the
options are read with it at configure time, where the results model is not needed yet (an
endpoint in the ini file, no test that needs the server)."""

from __future__ import annotations

K = 1024
MAX = "max"
#: a prefill context: the largest prompt the server accepts with one output token
#: (max_model_len − 1), the model's own limit
LIMIT = "limit"


def context_label(context: int | str) -> str:
    """Readable label: 8192 → ``8K``, 1500 → ``1500``, ``max`` stays ``max``."""
    if isinstance(context, str):
        return context
    if context % K == 0:
        return f"{context // K}K"
    return str(context)


def display_label(tokens: int) -> str:
    """Label for a resolved length in tables: exact K multiples as ``8K``, others from 10K up
    to the nearest K (``limit`` at max_model_len 262,144 is 262,143 tokens: ``256K``, as the
    reference page writes it), below that the tokens."""
    if tokens % K == 0 or tokens >= 10 * K:
        return f"{round(tokens / K)}K"
    return f"{tokens:,}"


__all__ = ["LIMIT", "MAX", "K", "context_label", "display_label"]
