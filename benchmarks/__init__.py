"""Speed and accuracy benchmarks of pytest-llmspeed, with their recorded results (``results/``).

The suite (docs/benchmarks.md): the plugin's own cost and accuracy, run by ``benchmarks.harness``
(``python -m benchmarks run``, ``tox -e benchmarks``), each benchmark writing
``results/NAME.json`` (its figures, the commit, the machine, its load, the versions) beside its
page ``results/NAME.md``; ``python -m benchmarks quote`` sets the figures the README and docs
quote from them. ``studies/`` holds the one-off studies that answered one issue each.

Each is a module run from the repository root, with the project installed (``pip install -e
.``): ``python -m benchmarks.NAME --help``. What they share (a quiet machine, real vLLM,
``vllm bench serve``, Markdown results pages) is in ``benchmarks.common``; real vLLM is started
by ``engines.servers``, as for the tests. Only ``history_speed`` reads ``tests/`` (the results
files of ``tests/history_runs.py``).
"""
