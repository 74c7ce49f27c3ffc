"""Project-wide test configuration: pytester for plugin tests, the real-vLLM fixtures."""

pytest_plugins = ["pytester", "tests.vllm_server"]
