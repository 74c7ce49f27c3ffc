"""An early-ended window's recorded interval is the one its early end was decided on
(``--llm-precision``): the live test (``protocol._LiveEvents``) reads the streams' raw reads
while the window is open, the cell's interval is computed after it from the parsed chunks
(``stats.decode_stats``); on the same tokens, times and spreading they are the same number."""

import json

import numpy as np
import pytest

from pytest_llmspeed.core.client import StreamRecord, account_tokens
from pytest_llmspeed.core.intervals import batch_means
from pytest_llmspeed.core.protocol import _LiveEvents
from pytest_llmspeed.core.stats import RequestTrace, decode_stats

FULL = 20.0  # the window's planned length
NOW = 6.0  # when the early end is decided
STOP = 6.05  # when the streams are cancelled (reads go on arriving until then)
N = 4
MAX_OUTPUT = 64


def event(completion_tokens: int, n_new: int) -> bytes:
    obj = {
        "choices": [{"index": 0, "text": "ab" * n_new, "finish_reason": None}],
        "usage": {
            "prompt_tokens": 1024,
            "completion_tokens": completion_tokens,
            "total_tokens": 1024 + completion_tokens,
        },
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def busy_client_streams(seed: int) -> list[tuple[StreamRecord, bool]]:
    """N streams of 64-token requests, restarted at once, from a server that sends 1 to 3
    tokens every ~4 ms, read by a client as busy as a loaded machine makes it: a read every
    1-12 ms brings every event sent since the last (often several: chunks read together),
    and one read in five ends inside an event whose rest comes 0.3 ms later. Each record
    with whether it finished; requests still open at ``STOP`` are cut there."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(N):
        t = float(rng.uniform(-0.3, 0.0))
        while t < STOP:
            rec = StreamRecord(t_send=t)
            sent: list[tuple[float, bytes]] = []
            step, tokens = t + 0.003, 0
            while tokens < MAX_OUTPUT:
                step += float(rng.uniform(0.003, 0.005))
                n_new = min(int(rng.integers(1, 4)), MAX_OUTPUT - tokens)
                tokens += n_new
                sent.append((step, event(tokens, n_new)))
            sent.append((step, b"data: [DONE]\n\n"))
            read_at, i = t, 0
            while i < len(sent) and read_at < STOP:
                read_at = max(read_at + float(rng.uniform(0.001, 0.012)), sent[i][0])
                data = b"".join(b for s, b in sent[i:] if s <= read_at)
                i += sum(1 for s, _ in sent[i:] if s <= read_at)
                if read_at >= STOP:
                    break
                if rng.uniform() < 0.2 and i < len(sent):
                    cut = len(data) - int(rng.integers(1, 40))  # inside its last event
                    rec.reads.append((read_at, data[:cut]))
                    read_at += 0.0003
                    data = data[cut:]
                    if read_at >= STOP:
                        break
                rec.reads.append((read_at, data))
            finished = i >= len(sent)
            rec.t_end = read_at if finished else STOP
            rec.cancelled = not finished
            out.append((rec, finished))
            t = rec.t_end
    return sorted(out, key=lambda x: x[0].t_send)  # the order the protocol makes them in


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_early_end_is_decided_on_the_interval_the_cell_records(seed):
    streams = busy_client_streams(seed)
    # while the window is open: the live test reads what has arrived, every half second
    live = _LiveEvents()
    growing = [StreamRecord(t_send=rec.t_send) for rec, _ in streams]
    fed = [0] * len(streams)
    for tick in np.arange(2.0, NOW + 1e-9, 0.5):
        for i, (g, (rec, _)) in enumerate(zip(growing, streams, strict=True)):
            while fed[i] < len(rec.reads) and rec.reads[fed[i]][0] < tick:
                g.tally.feed(*rec.reads[fed[i]])  # as the client counts each read
                fed[i] += 1
        live.update([g for g in growing if g.t_send < tick])
    times, counts, starts = live.arrays()
    decided = batch_means(times, counts, 0.0, NOW, starts, full=FULL)
    assert decided is not None
    # after the window: the cell's own accounting of every read, later ones included
    traces = []
    for rec, finished in streams:
        assert rec.t_end is not None
        account_tokens(rec, MAX_OUTPUT)
        traces.append(
            RequestTrace(rec.t_send, rec.t_end, rec.token_times, rec.token_counts, finished)
        )
    assert any(len(r.token_times) > len({*r.token_times}) for r, _ in streams)  # read together
    assert any(t >= NOW for r, _ in streams for t in r.token_times)  # arrived after the end
    stats = decode_stats(traces, 0.0, NOW, N, full=FULL)
    assert stats.total_ci is not None and stats.precision is not None
    assert (stats.total_ci.low, stats.total_ci.high) == pytest.approx(
        (decided.interval.low, decided.interval.high), rel=1e-12
    )
    value = float(counts[(times >= 0) & (times < NOW)].sum()) / NOW
    assert value == pytest.approx(stats.total_tok_s, rel=1e-12)
    # so the window may end at a goal exactly when the precision the cell records is within it
    assert not stats.drift or not stats.drift.flagged
    assert live.precise_enough(0.0, NOW, stats.precision * (1 + 1e-9), FULL)
    assert not live.precise_enough(0.0, NOW, stats.precision * (1 - 1e-9), FULL)
