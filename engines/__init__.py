"""The project's real engines, started for its tests and benchmarks: vLLM (CPU build),
``transformers serve`` and llama-cpp-python's server, each on loopback, offline, serving the tiny
random-weight model of ``scripts/setup_vllm.py``.

Project tooling, not the plugin (the plugin's own ``--llm-serve`` launcher is
``pytest_llmspeed.core.launch``, which this package reuses to run each engine):

- ``engines.home``: where the set-ups live (``$LLMSPEED_VLLM_HOME``), their layouts and the
  offline environment. Standard library only: ``scripts/setup_*.py`` import it with plain
  ``python``, before the project is installed.
- ``engines.servers``: starting and stopping the engines (``Servers`` for vLLM,
  ``transformers_serve``, ``llama_cpp_server``); ``StartError`` when one cannot start. No
  pytest: ``tests/vllm_server.py`` and the engine tests turn that error into a failed test,
  ``benchmarks/common.py`` into an exit.

Importable from the repository's root: ``python -m benchmarks.NAME`` and ``pytest`` (the root
``conftest.py`` puts the root on ``sys.path``) find it there. Nothing is imported here, so that
``import engines.home`` stays standard library only.
"""
