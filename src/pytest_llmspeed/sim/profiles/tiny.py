"""``tiny``: a small, fast model for quick tests (not modelled on any real deployment).

Steps take a few milliseconds, a cold 8K prompt prefills in about 50 ms, and the KV cache is
small (131,072 tokens) so that admission under KV pressure is easy to provoke.
"""

from __future__ import annotations

from . import Profile

PROFILE = Profile(
    name="tiny",
    description="small fast model for quick tests: 32K context, 128K-token KV cache",
    served_model_name="tiny",
    version="0.26.1+llmspeed.sim",
    max_model_len=32768,
    block_size=16,
    kv_capacity_tokens=131072,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    num_speculative_tokens=2,
    draft_acceptance=(0.7, 0.5),
    step_base_s=0.004,
    decode_per_seq_s=20e-6,
    decode_per_seq_sq_s=0.0,
    decode_per_context_token_s=5e-9,
    prefill_per_token_s=5e-6,
    prefill_attention_s=1e-11,
    frontend_base_s=0.001,
    frontend_per_prompt_token_s=1e-7,
    reasoning_tokens=8,
    eos_probability=0.002,
    byte_pair_probability=0.05,
)
