"""The shipped upgrade workflow, run as GitHub Actions runs it, with the simulator standing for
vLLM: how often it fails a 10 % slower decode and passes an unchanged version.

The workflow's A/B step (docs/github-actions-llmspeed.yml, "A/B of the old and the new
version") is taken from the file and run by ``bash --noprofile --norc -eo pipefail`` in a
scratch repository (an empty ``perf/``, unit tests of its own and an ini file beside it), with
the job's environment as the install step leaves it. The substitutions, and only these:

- ``$OLD_VLLM`` and ``$NEW_VLLM`` are executables named ``vllm`` that start the simulator on
  the port the command gives (``vllm serve MODEL ... --port N`` → ``python -m
  pytest_llmspeed.sim --port N --profile tiny --speed S --start-noise 0.02``), the new one with
  ``--slower decode:F`` for a slower version (F = x / (1 − x): decode steps that take 1 / (1 −
  x) as long, so that its throughput is 1 − x of the old one's);
- ``LLM_MATRIX`` and ``LLM_BUDGET``: a matrix and a budget a simulated round can afford
  (``--matrix``, ``--budget``); the workflow's own are for a GPU's 30 s windows.

Each run's job outcome is the step's exit status (0 passes the job); the results file gives
each cell's verdict. The page says how the job ends under each unknown policy (the same
runs: ``--llm-unknown`` changes only the exit status): ``fail`` fails on a regressed or an
unknown cell, ``warn`` (the workflow's) on a regressed one.

    python -m benchmarks.studies.workflow_ab --runs 10 --busy 2

``--busy N`` starts N busy loops (``python -c "while True: pass"``) for the whole study, as
the target says ("on a runner with two busy loops beside it"). Results:
benchmarks/results/workflow_ab.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "github-actions-llmspeed.yml"
STEP = "A/B of the old and the new version"
OUT = ROOT / "benchmarks" / "results" / "workflow_ab.md"

#: the stand-in for ``vllm``: ``vllm serve MODEL ... --port N`` starts the simulator on N
SHIM = """#!/bin/sh
port=""
while [ $# -gt 0 ]; do
  if [ "$1" = "--port" ]; then port="$2"; fi
  shift
done
exec {python} -m pytest_llmspeed.sim --port "$port" {args}
"""


def step_script(name: str = STEP, workflow: Path = WORKFLOW) -> str:
    """The ``run: |`` script of the workflow's step whose name starts with ``name``."""
    lines = workflow.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f"- name: {name}"))
    run = next(i for i in range(start, len(lines)) if lines[i].strip() == "run: |")
    indent = len(lines[run + 1]) - len(lines[run + 1].lstrip())
    body = []
    for ln in lines[run + 1 :]:
        if ln.strip() and len(ln) - len(ln.lstrip()) < indent:
            break
        body.append(ln[indent:])
    return "\n".join(body) + "\n"


def shim(folder: Path, args: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vllm"
    path.write_text(SHIM.format(python=shlex.quote(sys.executable), args=args))
    path.chmod(0o755)
    return path


def scratch_repo(where: Path) -> None:
    """A user's repository: unit tests of its own, an ini file, an empty perf/."""
    (where / "perf").mkdir(parents=True)
    (where / "tests").mkdir()
    (where / "tests" / "test_units.py").write_text(
        "def test_one():\n    assert 1 + 1 == 2\n\n\ndef test_two():\n    assert 'a' < 'b'\n"
    )
    (where / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["tests"]\naddopts = "-ra"\n'
    )


def one_run(work: Path, slower: float, args: argparse.Namespace) -> dict[str, Any]:
    repo = work / "repo"
    scratch_repo(repo)
    base = f"--profile tiny --speed {args.speed} --start-noise 0.02"
    factor = slower / (1 - slower)
    new_args = base + (f" --slower decode:{factor:.6f}" if slower else "")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GITHUB_"))}
    env.update(
        OLD_VLLM=str(shim(work / "old", base)),
        NEW_VLLM=str(shim(work / "new", new_args)),
        MODEL="tiny",
        SERVED_NAME="tiny",
        LLM_MATRIX=args.matrix,
        LLM_BUDGET=args.budget,
        RUNNER_TEMP=str(work),
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
    )
    began = time.monotonic()
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step_script()],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout,
    )
    took = time.monotonic() - began
    results = repo / "out" / "results.json"
    verdicts: dict[str, str] = {}
    starts: dict[str, int] = {}
    if results.exists():
        doc = json.loads(results.read_text()).get("ab") or {}
        for cell, v in (doc.get("cells") or {}).items():
            verdicts[cell] = v.get("verdict")
            starts[cell] = v.get("starts", 0)
    return {
        "slower": slower,
        "exit": done.returncode,
        "seconds": round(took, 1),
        "verdicts": verdicts,
        "starts": starts,
        "tail": done.stdout.splitlines()[-1:],
    }


def render(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "# The shipped upgrade workflow on the simulator",
        "",
        f"`python -m benchmarks.studies.workflow_ab --runs {args.runs} --busy {args.busy} "
        f'--matrix "{args.matrix}" --budget {args.budget} --speed {args.speed}` '
        f"({dt.date.today().isoformat()}, this machine: 2 cores shared with other work, "
        f"{args.busy} busy loops of its own beside it). The workflow's A/B step run verbatim by "
        "bash, the simulator standing for vLLM (benchmarks/studies/workflow_ab.py says how).",
        "",
        "Each policy's job outcome comes from the same runs' verdicts: `--llm-unknown` changes "
        "only the exit status, not the rounds.",
        "",
        "| new version | runs | job failed (its exit ≠ 0) | failed at `--llm-unknown=fail` | "
        "failed at `--llm-unknown=warn` | regressed cells | unknown cells | same cells | "
        "mean minutes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for slower in sorted({float(r["slower"]) for r in runs}):
        group = [r for r in runs if r["slower"] == slower]
        cells = [v for r in group for v in r["verdicts"].values()]
        failed = sum(1 for r in group if r["exit"] != 0)
        at_fail = sum(1 for r in group if {"regressed", "unknown"} & set(r["verdicts"].values()))
        at_warn = sum(1 for r in group if "regressed" in r["verdicts"].values())
        name = "unchanged" if slower == 0 else f"decode {slower:.0%} slower"
        minutes = sum(float(r["seconds"]) for r in group) / len(group) / 60
        lines.append(
            f"| {name} | {len(group)} | {failed} | {at_fail} | {at_warn} | "
            f"{cells.count('regressed')} | {cells.count('unknown')} | {cells.count('same')} | "
            f"{minutes:.1f} |"
        )
    lines += ["", "Each run:", ""]
    for r in runs:
        lines.append(
            f"- slower {float(r['slower']):.0%}: exit {r['exit']}, {r['seconds']} s, "
            f"{json.dumps(r['verdicts'])}, starts {json.dumps(r['starts'])}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10, help="runs of each version (default 10)")
    p.add_argument("--busy", type=int, default=2, help="busy loops beside the study")
    p.add_argument(
        "--matrix",
        default="--llm-contexts=1K --llm-concurrency=1,8 --llm-duration=2 --llm-max-output=256",
    )
    p.add_argument("--budget", default="4m", help="LLM_BUDGET (default 4m)")
    p.add_argument("--speed", type=float, default=10.0, help="the simulator's speed")
    p.add_argument("--slower", type=float, default=0.10, help="the slower version's x")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--rerender", type=Path, help="the page again from a log of this study")
    args = p.parse_args(argv)
    if args.rerender:
        logged = args.rerender.read_text().splitlines()
        args.out.write_text(render([json.loads(ln) for ln in logged if ln[:1] == "{"], args))
        return 0
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="workflow-ab-") as tmp:
            for i in range(args.runs):
                for slower in (args.slower, 0.0):  # interleaved: a slow hour hits both
                    work = Path(tmp) / f"run{i}-{slower}"
                    runs.append(one_run(work, slower, args))
                    print(json.dumps(runs[-1]), flush=True)
                    args.out.write_text(render(runs, args))
    finally:
        for b in busy:
            b.kill()
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
