"""One-off studies, each of which answered one issue; kept as the record of how their results
pages (``benchmarks/results/``) were made, not re-run by the suite (docs/benchmarks.md).

Each still runs from the repository root: ``python -m benchmarks.studies.NAME --help``. They
share ``benchmarks.common`` with the suite and may need real vLLM (``scripts/setup_vllm.py``).
"""
