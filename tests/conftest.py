"""Shared by the plugin and real-vLLM tests, which run pytest in pytest (``pytester``). Every
results file such a run writes is checked against the published JSON Schema
(docs/results.schema.json) after the test."""

from __future__ import annotations

import json

# The client processes' multiprocessing modules, imported before any pytester run: pytester's
# in-process runs drop from sys.modules what they imported, but the ``multiprocessing``
# package keeps its attribute for each submodule, so a later ``from . import heap`` took the
# old module while pickle imported a new one ("Can't pickle <class
# 'multiprocessing.heap.BufferWrapper'>: it's not the same object") in every core test of
# client processes that ran after a plugin test of them on the same worker.
import multiprocessing.connection
import multiprocessing.heap
import multiprocessing.popen_spawn_posix
import multiprocessing.queues
import multiprocessing.resource_tracker
import multiprocessing.sharedctypes
import multiprocessing.spawn
import multiprocessing.synchronize  # noqa: F401
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[1] / "docs" / "results.schema.json").read_text()
)


def _results_files(root: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in root.rglob("*.json"):
        try:
            doc = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
        if isinstance(doc, dict) and str(doc.get("schema", "")).startswith("pytest-llmspeed/"):
            yield path, doc


@pytest.fixture(autouse=True)
def _pytester_runs_without_pytest_asyncio(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sessions a test runs with pytester collect no async test: without pytest-asyncio
    there (a test dependency of this project, not of the plugin) they print only what a user
    of the plugin would see, not its warning about an unset loop scope; and they run as a
    user's plain run even when the suite runs under pytest-xdist."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # it clears PYTEST_ADDOPTS when it is set up
        addopts = f"{os.environ.get('PYTEST_ADDOPTS', '')} -p no:asyncio".strip()
        monkeypatch.setenv("PYTEST_ADDOPTS", addopts)
        # a run inside an xdist worker is a user's plain run, not a worker's (pytest-benchmark
        # reads these and would disable itself, with a warning)
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _results_follow_the_schema(request: pytest.FixtureRequest) -> Iterator[None]:
    if "pytester" not in request.fixturenames:
        yield
        return
    root = request.getfixturevalue("pytester").path  # set up first, so torn down after us
    yield
    for path, doc in _results_files(root):
        try:
            jsonschema.Draft202012Validator(SCHEMA).validate(doc)
        except jsonschema.ValidationError as exc:
            pytest.fail(f"{path.name} does not follow the results schema: {exc.message}")


@pytest.fixture
def results_doc(pytester: pytest.Pytester) -> Callable[..., dict[str, Any]]:
    """``results_doc("out.json")``: the results document a pytester run wrote, with its cells
    also by id under ``"by_id"``."""

    def read(name: str = "out.json") -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((pytester.path / name).read_text())
        doc["by_id"] = {c["id"]: c for c in doc["cells"]}
        return doc

    return read


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    """A ``tiny`` simulator at speed 4 in its own process, shared by a module's tests."""
    from pytest_llmspeed.sim import SimOptions, running_simulator_process

    with running_simulator_process(SimOptions(profile="tiny", speed=4.0)) as url:
        yield url


# -- the suite's kinds and its units of parallel work (docs/testing.md) ----------------------

#: the folder a test lives in names its kind; each kind is a marker (``-m "not engine"``)
KINDS = {
    "unit": "unit",
    "core": "core",
    "sim": "sim",
    "hostile": "hostile",
    "plugin": "plugin",
    "page": "browser",
    "vllm": "engine",
    "engines": "engine",
}


def scope_of(nodeid: str) -> str:
    """The unit of work pytest-xdist hands a worker whole (``tests/conftest.py``'s scheduler):
    a test file, so that a module-scoped fixture (the hostile battery, a browser, an engine's
    server, a series of runs) is set up once, not once a worker; and every test of real vLLM
    but the A/B as one unit, one start at a time (four starts at once on two cores took
    minutes each: a start is CPU-bound, it compiles), the A/B's eight starts on a worker of
    their own. (pytest-xdist's ``xdist_group`` marks do not group under pytest 9, whose node
    ids they can no longer rewrite.)"""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/vllm/") and not path.endswith("/test_ab_vllm.py"):
        return "tests/vllm"
    return path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") not in ("loadgroup", "loadscope", "loadfile"):
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    # the units in the order collected (FIRST: the longest chains first), not pytest-xdist's
    # default of the most tests first, which sent the A/B on real vLLM (one test, 440 s) out
    # at about 550 s of a 1,010 s run and made it the run's tail
    config.option.loadscopereorder = False

    class ByScope(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ByScope(config, log)


#: the folders in the order they start: the longest chains first (real vLLM's starts, an A/B
#: of eight among them; the other engines; the hostile battery), so that pytest-xdist's
#: workers do not wait on them at the end
FIRST = ("vllm", "engines", "hostile", "page", "plugin", "core", "sim", "unit")


def _folder(item: pytest.Item) -> str | None:
    try:
        return item.path.resolve().relative_to(Path(__file__).resolve().parent).parts[0]
    except ValueError:
        return None


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        kind = KINDS.get(_folder(item) or "")
        if kind is not None:
            item.add_marker(kind)


class _Order:
    @pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle, kept within a folder
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        def rank(item: pytest.Item) -> tuple[int, bool]:
            folder = _folder(item)
            first = FIRST.index(folder) if folder in FIRST else len(FIRST)
            return first, item.path.name != "test_ab_vllm.py"  # the longest chain of all

        items.sort(key=rank)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Order(), "llmspeed-tests-order")
