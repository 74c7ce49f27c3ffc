"""``h200-qwen3.5-27b-int4``: vLLM 0.26 serving Qwen3.5-27B-GPTQ-Int4 on one H200 NVL.

Fitted to ``shared/reference/h200-qwen3.5-27b-int4-vllm.txt`` (launch: ``--max-model-len 262144
--speculative-config '{"method":"mtp","num_speculative_tokens":2}'``); the fit, cell by cell, is
in ``docs/reference-fit.md`` and is recomputed by ``benchmarks/reference_fit.py``.

KV capacity: the reference marks 16 decode cells over capacity with 4096-token outputs. With
contexts 8K..251K (K = 1024) the rule N x (C + 4096) > capacity gives exactly those 16 cells for
any capacity from 1,310,720 (16K x 64 must fit) to 1,572,863 (8K x 128 must not); 1,441,792
tokens = 90,112 blocks of 16 sits in the middle.
"""

from __future__ import annotations

from . import Profile

PROFILE = Profile(
    name="h200-qwen3.5-27b-int4",
    description="vLLM 0.26 + Qwen3.5-27B-GPTQ-Int4 on one H200 NVL, MTP x2 (fitted reference)",
    served_model_name="qwen",
    version="0.26.1+llmspeed.sim",
    max_model_len=262144,
    block_size=16,
    kv_capacity_tokens=1441792,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    num_speculative_tokens=2,
    draft_acceptance=(0.75, 0.55),
    step_base_s=0.01435,
    decode_per_seq_s=0.000202,
    decode_per_seq_sq_s=2.48e-6,
    decode_per_context_token_s=1.31e-8,
    prefill_per_token_s=83.2e-6,
    prefill_attention_s=6.98e-10,
    frontend_base_s=0.08,
    frontend_per_prompt_token_s=3.08e-6,
    reasoning_tokens=256,
    eos_probability=0.0005,
    byte_pair_probability=0.01,
    hardware="H200 NVL 141GB",
    # the model's bytes for the bandwidth bound, an estimate from its shape (not fitted): about
    # 27 B parameters at 4 bits in the linear layers plus the 16-bit LM head and MTP layer, 16 GB
    # read per step; 16 full-attention layers of 4 KV heads x 256 dims x 2 (K, V) x 2 bytes =
    # 64 KiB per token, which puts the reference's 1,441,792-token KV cache at 94.5 GB, what an
    # H200 NVL at --gpu-memory-utilization 0.88 has left after the weights
    weight_bytes=16.0e9,
    kv_bytes_per_token=65536.0,
)
