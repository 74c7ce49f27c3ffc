"""pytest-llmspeed: LLM serving benchmarks (prefill, sustained decode) as pytest tests.

The measurement core (``client``, ``probe``, ``prompts``, ``protocol``, ``stats``, ``matrix``)
imports no pytest; ``plugin`` is the thin pytest layer; ``sim`` is the built-in simulator.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
