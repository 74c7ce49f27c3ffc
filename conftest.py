"""Project-wide test configuration: pytester for plugin tests, the real-vLLM fixtures."""

# pytester's in-process runs drop modules imported during a run; numpy cannot be imported twice
# in one process, so the heavy modules are imported once here, before any pytester run.
import numpy  # noqa: F401

import pytest_llmspeed.core.bench  # noqa: F401
import pytest_llmspeed.core.records  # noqa: F401
import pytest_llmspeed.plugin.session  # noqa: F401

pytest_plugins = ["pytester", "tests.vllm_server"]
