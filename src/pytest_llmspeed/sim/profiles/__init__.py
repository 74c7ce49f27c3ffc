"""Simulator profiles: one frozen dataclass per simulated (server, model, GPU).

A profile is data only. Every time is in seconds at ``--speed 1``; the engine divides them by the
speed. The step-time model (see ``docs/simulator.md``) is::

    step = step_base_s
         + decode_per_seq_s * n + decode_per_seq_sq_s * n**2
         + decode_per_context_token_s * sum(ctx)
         + sum over prefill chunks (prefill_per_token_s * q + prefill_attention_s * q * (p + q/2))

where ``n`` is the number of decoding sequences, ``ctx`` their context (prompt + output so far),
``q`` the tokens of a prefill chunk and ``p`` the tokens of its prompt already in the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """One simulated deployment. Fields are documented in ``docs/simulator.md``."""

    name: str
    """Profile name as given to ``--profile``."""
    description: str
    """One line for ``--help`` and the startup banner."""
    served_model_name: str
    """Model id in ``/v1/models`` and in responses."""
    version: str
    """What ``/version`` answers."""
    max_model_len: int
    """Largest prompt + output a request may have (tokens)."""
    block_size: int
    """Tokens per KV-cache block (prefix-cache granularity and allocation unit)."""
    kv_capacity_tokens: int
    """Tokens the KV cache holds, all requests together; a multiple of ``block_size``."""
    max_num_seqs: int
    """Most requests running at once (vLLM ``--max-num-seqs``)."""
    max_num_batched_tokens: int
    """Per-step token budget shared by decode and chunked prefill."""
    num_speculative_tokens: int
    """MTP draft tokens per step; a decoding sequence gains 1 + accepted drafts per step."""
    draft_acceptance: tuple[float, ...]
    """P(draft i accepted | drafts before it accepted), one entry per speculative token."""
    step_base_s: float
    """Fixed cost of every step (weights read, launch, sampling)."""
    decode_per_seq_s: float
    """Cost per decoding sequence in a step (its 1 + k verified tokens)."""
    decode_per_seq_sq_s: float
    """Cost per squared number of decoding sequences (batch growing past memory-bound)."""
    decode_per_context_token_s: float
    """Attention cost per context token of every decoding sequence."""
    prefill_per_token_s: float
    """Cost per prefilled token (projections, MLP)."""
    prefill_attention_s: float
    """Attention cost per (prefilled token x context token) pair."""
    frontend_base_s: float
    """API-server latency before a request reaches the scheduler (parsing, validation)."""
    frontend_per_prompt_token_s: float
    """Further API-server latency per prompt token (hashing, transfer to the engine)."""
    reasoning_tokens: int
    """First output tokens of a chat answer streamed as reasoning (0: no reasoning)."""
    eos_probability: float
    """Per-token chance of an EOS draw once ``min_tokens`` are out, without ``ignore_eos``."""
    byte_pair_probability: float
    """Per-token chance that an output character comes as two byte tokens, the first empty."""
    vocab_size: int = 32000
    """Token ids are 0 .. vocab_size - 1."""
    hardware: str = ""
    """The GPU the profile simulates, as ``nvidia-smi`` names it plus its memory ("" : none):
    the run's hardware, and the peak bandwidth the share of the bound is taken of."""
    weight_bytes: float = 0.0
    """Bytes of weights each engine step reads (0: unknown): the read-bytes counter and the
    bandwidth estimate (docs/metrics.md, "Distance to the bandwidth bound")."""
    kv_bytes_per_token: float = 0.0
    """Bytes of KV cache per context token each step reads for every running request."""

    @property
    def num_gpu_blocks(self) -> int:
        """KV-cache blocks at the default capacity."""
        return self.kv_capacity_tokens // self.block_size

    @property
    def mean_tokens_per_step(self) -> float:
        """Expected tokens a decoding sequence gains per step (1 + accepted drafts)."""
        total, p = 1.0, 1.0
        for a in self.draft_acceptance:
            p *= a
            total += p
        return total


def _registry() -> dict[str, Profile]:
    from .h200_qwen35_27b_int4 import PROFILE as H200
    from .tiny import PROFILE as TINY

    return {p.name: p for p in (TINY, H200)}


PROFILES: dict[str, Profile] = _registry()


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ``ValueError`` naming the valid ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown simulator profile {name!r}; valid profiles: {', '.join(sorted(PROFILES))}"
        ) from None


__all__ = ["PROFILES", "Profile", "get_profile"]
