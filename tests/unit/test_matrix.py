import pytest

from pytest_llmspeed.core.matrix import (
    Limits,
    MatrixError,
    decode_skip,
    display_label,
    over_capacity,
    parse_concurrency,
    parse_contexts,
    resolve_context,
)
from pytest_llmspeed.results import CellId, Status


def test_parse_contexts_k_is_1024_and_max():
    assert parse_contexts("8K,16k,8192,max,1.5K") == [8192, 16384, "max", 1536]


@pytest.mark.parametrize("bad", ["", "8X", "-1", "0", "1.3", "max8"])
def test_parse_contexts_rejects(bad):
    with pytest.raises(MatrixError):
        parse_contexts(bad)


def test_limit_is_a_prefill_context_only():
    assert parse_contexts("8K,max,limit", prefill=True) == [8192, "max", "limit"]
    with pytest.raises(MatrixError, match=r"'limit' is a prefill context .* use 'max'"):
        parse_contexts("8K,limit")
    assert str(CellId.parse("prefill[limit]")) == "prefill[limit]"
    with pytest.raises(ValueError):
        CellId.parse("decode[limit-c1]")


def test_parse_concurrency():
    assert parse_concurrency("1, 2,4,4") == [1, 2, 4]
    with pytest.raises(MatrixError, match="whole number"):
        parse_concurrency("1,two")
    with pytest.raises(MatrixError):
        parse_concurrency("0")


def test_cell_ids():
    assert CellId.decode(32768, 8).param_id == "32K-c8"
    assert CellId.decode("max", 1).param_id == "max-c1"
    assert CellId.prefill(1000).param_id == "1000"


def test_resolve_max_and_label():
    assert resolve_context("max", 262144, 4096) == 258048
    assert display_label(258048) == "252K"
    assert resolve_context("max", None, 4096) is None
    # the model's own limit: one output token; shown as the reference page shows it
    assert resolve_context("limit", 262144, 4096) == 262143
    assert display_label(262143) == "256K"
    assert resolve_context("limit", None, 4096) is None


def test_over_capacity_reason_shows_the_arithmetic():
    skip = over_capacity(32768, 64, 4096, Limits(1_400_000, None))
    assert skip is not None and skip.status is Status.OVER_CAPACITY
    assert skip.reason == "Over capacity: 64 × (32K + 4096) = 2,359,296 > KV capacity 1,400,000"
    assert over_capacity(32768, 32, 4096, Limits(1_400_000, None)) is None
    assert over_capacity(32768, 64, 4096, Limits(None, None)) is None


def test_over_capacity_is_per_replica_over_several_replicas():
    """N streams spread over the replicas: the busiest holds ceil(N / replicas) of them, and
    each replica has its own KV cache (the smallest one's capacity counts)."""
    two = Limits(9000, None, replicas=2)
    assert over_capacity(4096, 4, 128, two) is None  # 2 × 4,224 = 8,448 fits one replica
    skip = over_capacity(4096, 5, 128, two)  # 3 per replica on the busiest
    assert skip is not None and skip.status is Status.OVER_CAPACITY
    assert skip.reason == (
        "Over capacity: ceil(5 / 2 replicas) × (4K + 128) = 3 × 4,224 = 12,672 > "
        "KV capacity of one replica 9,000"
    )
    assert over_capacity(4096, 4, 128, Limits(9000, None)) is not None  # one replica: 16,896


def test_reference_matrix_has_sixteen_over_capacity_cells():
    """The reference's contexts with 4096-token outputs: exactly 16 cells over 1.4M tokens."""
    contexts = [8, 16, 32, 64, 128, 251]
    limits = Limits(1_400_000, 262144)
    over = [
        (c, n)
        for c in contexts
        for n in (1, 2, 4, 8, 16, 32, 64, 128)
        if decode_skip(c * 1024, n, 4096, limits)
    ]
    assert len(over) == 16
    assert (8, 128) in over and (8, 64) not in over and (251, 8) in over


def test_too_long_comes_first():
    skip = decode_skip(32768, 1, 4096, Limits(10**9, 32768))
    assert skip is not None and skip.status is Status.DOES_NOT_FIT
    assert skip.reason == "exceeds max_model_len: 32K + 4096 = 36,864 > max_model_len 32,768"
