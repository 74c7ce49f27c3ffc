"""The distance to the bandwidth bound (docs/metrics.md, "Distance to the bandwidth bound"):
sizes, the GPU table, the model from --llm-meta, and the estimate's arithmetic."""

import pytest

from pytest_llmspeed.core.bandwidth import (
    MemoryModel,
    decode_bandwidth,
    memory_model,
    parse_bytes,
    peak_of,
)
from pytest_llmspeed.core.stats import RequestTrace, output_in_flight
from pytest_llmspeed.results import ServerFigures


@pytest.mark.parametrize(
    ("text", "rate", "value"),
    [("16GB", False, 16e9), ("64KiB", False, 65536.0), ("16e9", False, 16e9),
     ("4.8TB/s", True, 4.8e12), ("4.8e12", True, 4.8e12), ("1 GiB", False, 2.0**30)],
)  # fmt: skip
def test_sizes(text, rate, value):
    assert parse_bytes(text, rate=rate) == pytest.approx(value)


@pytest.mark.parametrize("text", ["fast", "16 apples", "0GB", "4.8TB/s"])
def test_a_bad_size_says_what_to_write(text):
    with pytest.raises(ValueError, match="write 16GB, 64KiB or 16e9"):
        parse_bytes(text)  # a rate is not a size either


def test_the_gpu_table_takes_the_longest_name_that_occurs():
    assert peak_of("NVIDIA H100 NVL")[0] == 3.9e12  # type: ignore[index]
    assert peak_of("NVIDIA H100 80GB HBM3")[0] == 3.35e12  # type: ignore[index]
    assert peak_of("H200 NVL 141GB (simulated, speed 10x)")[0] == 4.8e12  # type: ignore[index]
    assert peak_of("AMD EPYC") is None and peak_of(None) is None


def test_the_model_from_meta_wins_over_the_profiles():
    got = memory_model(
        {"weight_bytes": "8GB", "gpu": "NVIDIA H100 PCIe"},
        hardware="H200 NVL",
        weight_bytes=16e9,
        kv_bytes_per_token=65536.0,
        source="the simulator's profile",
    )
    assert (got.weight_bytes, got.kv_bytes_per_token) == (8e9, 65536.0)
    assert got.peak_bytes_per_s == 2.0e12 and got.source == "--llm-meta"
    assert memory_model({"peak_bandwidth": "1TB/s"}).peak_bytes_per_s == 1e12
    assert memory_model({}).weight_bytes is None


MODEL = MemoryModel(16e9, 65536.0, 4.8e12)


def test_the_estimate_is_steps_times_weights_plus_the_running_contexts():
    server = ServerFigures(
        duration_s=10.0, steps_per_s=68.0, output_tokens_per_step=7.6, acceptance_length=1.9
    )
    got = decode_bandwidth(
        MODEL, server, context_tokens=8192, running=8.0, mean_output=1000.0, per_request_tok_s=0
    )
    assert got is not None and got.how == "estimate"
    # running from the counters (7.6 / 1.9 = 4), not the client's 8 in flight
    expected = 68.0 * (16e9 + 65536.0 * 4.0 * (8192 + 1000.0))
    assert got.bytes_per_s == pytest.approx(expected)
    assert got.share == pytest.approx(expected / 4.8e12)
    # no server figures: steps from per-request tok/s, running from the client
    got = decode_bandwidth(
        MODEL, None, context_tokens=8192, running=2.0, mean_output=0.0, per_request_tok_s=50.0
    )
    assert got is not None
    assert got.bytes_per_s == pytest.approx(50.0 * (16e9 + 65536.0 * 2.0 * 8192))
    # the server's own count wins; no model, no count: nothing
    counted = ServerFigures(duration_s=10.0, read_bytes_per_s=1.2e12, steps_per_s=68.0)
    got = decode_bandwidth(
        MemoryModel(), counted, context_tokens=1, running=1.0, mean_output=0.0,
        per_request_tok_s=1.0,
    )  # fmt: skip
    assert got is not None and (got.bytes_per_s, got.share, got.how) == (
        1.2e12, None, "server counter",
    )  # fmt: skip
    none = decode_bandwidth(
        MemoryModel(), None, context_tokens=1, running=1.0, mean_output=0.0, per_request_tok_s=1.0
    )
    assert none is None


def test_output_in_flight_is_the_time_weighted_tokens_so_far():
    # one request in flight over the whole window [0, 4): 1 token at t=1, 2 more at t=3
    one = RequestTrace(0.0, 10.0, [1.0, 3.0], [1, 2], False)
    # ∫ tokens so far = 1 × (4 − 1) + 2 × (4 − 3) = 5, over 4 s in flight
    assert output_in_flight([one], 0.0, 4.0) == pytest.approx(5 / 4)
    # a second, from t=2, with no token yet: in flight 2 s, holding none
    two = RequestTrace(2.0, 10.0, [], [], False)
    assert output_in_flight([one, two], 0.0, 4.0) == pytest.approx(5 / 6)
    # tokens that came before the window count whole
    assert output_in_flight([one], 3.5, 4.0) == pytest.approx(3.0)
    assert output_in_flight([], 0.0, 1.0) is None
