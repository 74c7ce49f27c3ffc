"""Distance to the memory-bandwidth bound of decode (docs/metrics.md, "Distance to the
bandwidth bound"). Pure: figures in, bytes per second and a share of the peak out.

Decode is bound by memory bandwidth: each engine step reads the weights once and the KV cache
of every running request's context. So a decode cell's read bandwidth is

    B = steps/s × (weight bytes + KV bytes per token × Σ running contexts)

and its distance to the hardware limit is B / the GPU's peak bandwidth. Where the server
counts the bytes itself (vLLM and SGLang ``…:estimated_read_bytes_per_gpu_total`` with
``--enable-mfu-metrics``) that count is used; else the formula, with the model's bytes given
by the user (``--llm-meta weight_bytes=16GB kv_bytes_per_token=64KiB``) or the simulator's
profile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..results import ServerFigures

__all__ = [
    "GPU_PEAK",
    "META_KEYS",
    "Bandwidth",
    "MemoryModel",
    "check_meta",
    "decode_bandwidth",
    "memory_model",
    "parse_bytes",
    "peak_of",
]

#: peak memory bandwidth (bytes/s) by GPU, as ``nvidia-smi`` / ``rocm-smi`` name them, from the
#: vendors' datasheets; the longest name that occurs in the run's hardware wins. Override with
#: ``--llm-meta peak_bandwidth=3.35TB/s``.
GPU_PEAK: dict[str, tuple[float, str]] = {
    "B200": (8.0e12, "NVIDIA DGX B200 datasheet: 8 TB/s HBM3e per GPU"),
    "H200": (4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s (SXM and NVL)"),
    "H100 NVL": (3.9e12, "NVIDIA H100 datasheet: H100 NVL 3.9 TB/s"),
    "H100 PCIe": (2.0e12, "NVIDIA H100 datasheet: H100 PCIe 2 TB/s"),
    "H100": (3.35e12, "NVIDIA H100 datasheet: H100 SXM 3.35 TB/s"),
    "GH200": (4.0e12, "NVIDIA GH200 datasheet: 4 TB/s HBM3 (the 96 GB part)"),
    "A100-SXM4-80GB": (2.039e12, "NVIDIA A100 datasheet: 80 GB SXM 2,039 GB/s"),
    "A100 80GB PCIe": (1.935e12, "NVIDIA A100 datasheet: 80 GB PCIe 1,935 GB/s"),
    "A100": (1.555e12, "NVIDIA A100 datasheet: 40 GB 1,555 GB/s"),
    "L40S": (0.864e12, "NVIDIA L40S datasheet: 864 GB/s"),
    "L4": (0.3e12, "NVIDIA L4 datasheet: 300 GB/s"),
    "RTX 4090": (1.008e12, "NVIDIA GeForce RTX 4090 specifications: 1,008 GB/s"),
    "MI300X": (5.3e12, "AMD Instinct MI300X datasheet: 5.3 TB/s"),
    "MI325X": (6.0e12, "AMD Instinct MI325X datasheet: 6 TB/s"),
}

_UNITS = {
    "": 1.0, "b": 1.0,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9.]+(?:e[+-]?\d+)?)\s*([kmgt]i?b|b)?\s*(/s)?\s*$", re.IGNORECASE)


def parse_bytes(text: str, rate: bool = False) -> float:
    """``16GB`` → 16e9, ``64KiB`` → 65536, ``4.8TB/s`` (``rate``) → 4.8e12; ValueError saying
    what to write otherwise."""
    m = _SIZE.match(text)
    example = "4.8TB/s or 4.8e12" if rate else "16GB, 64KiB or 16e9"
    if not m or (m.group(3) and not rate):
        raise ValueError(f"not a size in bytes{' per second' if rate else ''}: write {example}")
    try:
        value = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    except ValueError:
        raise ValueError(f"not a number: write {example}") from None
    if value <= 0:
        raise ValueError(f"must be above 0: write {example}")
    return value


def peak_of(hardware: str | None) -> tuple[float, str] | None:
    """The peak bandwidth and its source for a GPU name (``NVIDIA H200 NVL``), or None."""
    if not hardware:
        return None
    text = hardware.upper()
    found = [name for name in GPU_PEAK if name.upper() in text]
    if not found:
        return None
    best = max(found, key=len)
    return GPU_PEAK[best]


@dataclass(frozen=True)
class MemoryModel:
    """What the bound needs beside the cell's figures: the model's bytes read per step and per
    context token, and the GPU's peak bandwidth (each None when unknown), with where they
    came from, in words."""

    weight_bytes: float | None = None
    kv_bytes_per_token: float | None = None
    peak_bytes_per_s: float | None = None
    source: str = ""  # "the simulator's profile h200-...", "--llm-meta"
    peak_source: str = ""  # "NVIDIA H200 datasheet: 4.8 TB/s", "--llm-meta peak_bandwidth"


@dataclass(frozen=True)
class Bandwidth:
    """A decode cell's read bandwidth (bytes/s per GPU), its share of the peak (None when the
    peak is unknown), and how it was found."""

    bytes_per_s: float
    share: float | None
    how: str  # "server counter" or "estimate"


def decode_bandwidth(
    model: MemoryModel,
    server: ServerFigures | None,
    *,
    context_tokens: int,
    running: float | None,
    mean_output: float | None,
    per_request_tok_s: float | None,
) -> Bandwidth | None:
    """The cell's read bandwidth: the server's own count where it gives one, else steps/s ×
    (weight bytes + KV bytes per token × running × (context + mean output so far)), with
    steps/s and running from the server's counters where it gives them (else per-request
    tok/s ÷ acceptance length, and the client's requests in flight); None when neither way
    has what it needs."""
    peak = model.peak_bytes_per_s

    def share(b: float) -> float | None:
        return b / peak if peak else None

    if server is not None and server.read_bytes_per_s:
        return Bandwidth(server.read_bytes_per_s, share(server.read_bytes_per_s), "server counter")
    if model.weight_bytes is None or model.kv_bytes_per_token is None:
        return None
    steps = server.steps_per_s if server is not None else None
    accept = (server.acceptance_length if server is not None else None) or 1.0
    if steps is None and per_request_tok_s:
        steps = per_request_tok_s / accept
    if server is not None and server.output_tokens_per_step:
        running = server.output_tokens_per_step / accept
    if not steps or running is None:
        return None
    contexts = running * (context_tokens + (mean_output or 0.0))
    b = steps * (model.weight_bytes + model.kv_bytes_per_token * contexts)
    return Bandwidth(b, share(b), "estimate")


#: --llm-meta keys the bound reads (the rest of --llm-meta is free text)
META_KEYS = {
    "weight_bytes": "bytes of weights one step reads per GPU, e.g. 16GB",
    "kv_bytes_per_token": "KV-cache bytes per context token per GPU, e.g. 64KiB",
    "peak_bandwidth": "the GPU's peak memory bandwidth, e.g. 4.8TB/s",
}


def check_meta(meta: dict[str, str]) -> None:
    """ValueError naming the key when a --llm-meta value the bound reads is not a size."""
    for key in META_KEYS:
        if key in meta:
            try:
                parse_bytes(meta[key], rate=key == "peak_bandwidth")
            except ValueError as exc:
                raise ValueError(f"{key}={meta[key]}: {exc}") from None


def memory_model(
    meta: dict[str, str],
    *,
    hardware: str | None = None,
    weight_bytes: float | None = None,
    kv_bytes_per_token: float | None = None,
    source: str = "",
) -> MemoryModel:
    """The bound's inputs: --llm-meta's ``weight_bytes``, ``kv_bytes_per_token`` and
    ``peak_bandwidth`` where given (checked by :func:`check_meta`), else the ones passed (the
    simulator's profile), the peak from :data:`GPU_PEAK` by the hardware's name (--llm-meta
    ``gpu`` or ``hardware``, else ``hardware``)."""
    given = {k: meta[k] for k in META_KEYS if k in meta}
    w = parse_bytes(given["weight_bytes"]) if "weight_bytes" in given else weight_bytes
    kv = (
        parse_bytes(given["kv_bytes_per_token"])
        if "kv_bytes_per_token" in given
        else kv_bytes_per_token
    )
    peak: float | None = None
    peak_source = ""
    if "peak_bandwidth" in given:
        peak, peak_source = parse_bytes(given["peak_bandwidth"], rate=True), "--llm-meta"
    else:
        name = meta.get("gpu") or meta.get("hardware") or hardware
        found = peak_of(name)
        if found:
            peak, peak_source = found
    if {"weight_bytes", "kv_bytes_per_token"} & set(given):
        source = "--llm-meta"
    return MemoryModel(w or None, kv or None, peak, source, peak_source)
