"""Real engines beside vLLM, each started by its test module on loopback
(``engines.servers``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TypeVar

import pytest

from engines.servers import StartError

T = TypeVar("T")


@contextlib.contextmanager
def started(engine: contextlib.AbstractContextManager[T]) -> Iterator[T]:
    """``engine`` (one of ``engines.servers``) for the block; the test fails with the log's
    tail, without a traceback, when the engine does not start."""
    with contextlib.ExitStack() as stack:
        try:
            value = stack.enter_context(engine)
        except StartError as exc:
            pytest.fail(str(exc), pytrace=False)
        yield value
