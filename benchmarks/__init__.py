"""Speed and accuracy benchmarks of pytest-llmspeed, with their recorded results (``results/``).

Each is a module run from the repository root, with the project installed (``pip install -e
.``): ``python -m benchmarks.NAME --help``. What they share (a quiet machine, real vLLM,
``vllm bench serve``, Markdown results pages) is in ``benchmarks.common``; real vLLM is started
by ``engines.servers``, as for the tests. They import nothing of ``tests/``.
"""
