"""The simulator's text-dependent draft acceptance (``accept=text``, issue 33's "Real text")
against the plugin's figures: a decode cell whose prompts are made of a text that repeats
itself and one of a text that never does; the cell's acceptance is the simulator's own spec
counters over the window (the very /metrics texts the cell read, parsed whole here), and it
follows the model of docs/simulator.md ("Acceptance that follows the text").

Measured (tiny, 2K-token prompts, 4 streams, 3 s): the repeated text's prompts have a
predictability of 0.987, acceptance rate 0.839, acceptance length 2.68; the text that never
repeats 0.0, 0.0055 and 1.011."""

from __future__ import annotations

import random

import pytest

from pytest_llmspeed.core import protocol
from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.probe import probe
from pytest_llmspeed.core.prompt_text import PromptText
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import MetricsRead, negotiate, run_decode, run_prefill
from pytest_llmspeed.sim import SimOptions, running_simulator_process
from pytest_llmspeed.sim.engine import predictability, text_acceptance
from tests.core.test_server_figures_cell import rise, window_reads

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

CONTEXT = 2048
REPEATED = "the budget for the coming year was agreed after a long discussion. " * 200
_rng = random.Random(7)
NEVER = " ".join(
    "".join(_rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(8)) for _ in range(4000)
)


async def _cell(url: str, text: str, monkeypatch: pytest.MonkeyPatch):
    reads: list[MetricsRead] = []
    real = protocol._read

    async def recording(conn: object) -> MetricsRead:
        read = await real(conn)  # type: ignore[arg-type]
        reads.append(read)
        return read

    conn = Connection.open(url, None, 60)
    try:
        server = await probe(conn, None, None)
        factory = PromptFactory(conn, server.model, material=PromptText("t.txt", text))
        dialect = await negotiate(conn, factory, server.model, "completions")
        await run_prefill(conn, factory, dialect, server.model, CONTEXT, 16)
        prompt = (await factory.prompt(CONTEXT, 1)).body["prompt"]
        monkeypatch.setattr(protocol, "_read", recording)
        result = await run_decode(conn, factory, dialect, server.model, CONTEXT, 4, 4096, 3.0)
        monkeypatch.setattr(protocol, "_read", real)
    finally:
        await conn.close()
    assert len(prompt) == CONTEXT  # exact, as every prompt
    return result, window_reads(result, reads), prompt


async def test_acceptance_follows_how_predictable_the_text_is(monkeypatch):
    rates = {}
    with running_simulator_process(SimOptions(profile="tiny", accept="text")) as url:
        for name, text in (("repeated", REPEATED), ("never", NEVER)):
            result, inside, prompt = await _cell(url, text, monkeypatch)
            got = result.server
            assert got is not None
            open_, close = inside[0], inside[-1]
            drafts = rise("vllm:spec_decode_num_drafts_total", open_, close)
            accepted = rise("vllm:spec_decode_num_accepted_tokens_total", open_, close)
            draft_tokens = rise("vllm:spec_decode_num_draft_tokens_total", open_, close)
            assert drafts > 0 and (got.spec_drafts, got.spec_accepted_tokens) == (drafts, accepted)
            assert got.acceptance_rate == pytest.approx(accepted / draft_tokens, rel=1e-12)
            assert got.acceptance_length == pytest.approx(1 + accepted / drafts, rel=1e-12)
            # the model: tiny drafts 2 tokens, each accepted with a = text_acceptance(share)
            # once the one before it was (the share of a prompt differs by its suffix only)
            a = text_acceptance(predictability(prompt))
            assert got.acceptance_rate == pytest.approx((a + a * a) / 2, abs=0.02)
            rates[name] = got.acceptance_rate
    assert rates["repeated"] > 0.6 > 0.05 > rates["never"]
