#!/usr/bin/env python3
"""Check the package as a user gets it: build, check, install, run (tox -e package).

Standard library only (``build`` and ``twine`` are the tox environment's deps):

    python scripts/check_package.py            # everything in a temporary folder, removed after
    python scripts/check_package.py --keep DIR # the same in DIR, kept (the dist/ folder in it)

1. ``python -m build``: the sdist, then the wheel built from the sdist (a file the sdist lacks
   fails here).
2. ``twine check --strict``: the metadata and the long description render on a package page.
3. LICENSE is inside both (the sdist's root, the wheel's ``.dist-info/licenses/``).
4. A fresh virtual environment with the wheel installed (not editable, not this checkout).
5. From an empty folder, outside any project: a small matrix against the built-in simulator
   under ``-X dev -W error`` (warnings as errors, Python's development mode); it must pass,
   print no warning, and come from the installed wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATRIX = (
    "--llm-endpoint=sim:tiny?speed=4",
    "--llm-contexts=1K",
    "--llm-concurrency=1,2",
    "--llm-duration=1",
    "--llm-max-output=128",
    "--llm-results=out.json",
    "--junitxml=out.xml",
    "--llm-html=out.html",
)
CELLS = ["decode[1K-c1]", "decode[1K-c2]", "prefill[1K]"]


def step(
    name: str, cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    start = time.monotonic()
    print(f"[check_package] {name}: {' '.join(cmd)}", flush=True)
    done = subprocess.run(cmd, text=True, capture_output=True, cwd=cwd, env=env, check=False)
    print(f"[check_package] {name}: exit {done.returncode} in {time.monotonic() - start:.1f} s")
    if done.returncode != 0:
        sys.stdout.write(done.stdout[-6000:])
        sys.stdout.write(done.stderr[-6000:])
        raise SystemExit(f"[check_package] {name} failed")
    return done


def check_license(sdist: Path, wheel: Path) -> None:
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = sdist.name.removesuffix(".tar.gz")
    if f"{top}/LICENSE" not in names:
        raise SystemExit(f"[check_package] no LICENSE at the root of {sdist.name}")
    with zipfile.ZipFile(wheel) as whl:
        licenses = [n for n in whl.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    if not licenses:
        raise SystemExit(f"[check_package] no .dist-info/licenses/LICENSE in {wheel.name}")
    print(f"[check_package] LICENSE in {sdist.name} and {wheel.name} ({licenses[0]})")


def run(work: Path) -> None:
    total = time.monotonic()
    dist = work / "dist"
    step("build", [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)])
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    step(
        "twine check", [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)]
    )
    check_license(sdist, wheel)

    venv = work / "venv"
    step("virtualenv", [sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    step("install", [str(python), "-m", "pip", "install", "-q", "--no-input", str(wheel)])

    empty = work / "empty"
    empty.mkdir()
    # nothing of this checkout or of the caller's environment leaks in: no PYTHONPATH, no
    # endpoint or warning filter of the caller's, the folder outside any project
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LLMSPEED_", "PYTHON", "PYTEST_", "VIRTUAL_ENV"))
    }
    where = step(
        "import",
        [str(python), "-c", "import pytest_llmspeed; print(pytest_llmspeed.__file__)"],
        cwd=empty,
        env=env,
    ).stdout.strip()
    if not where.startswith(str(venv)):
        raise SystemExit(f"[check_package] the plugin came from {where}, not the wheel")
    matrix = [str(python), "-X", "dev", "-W", "error", "-m", "pytest", "-W", "error", *MATRIX]
    done = step("matrix (-X dev -W error)", matrix, cwd=empty, env=env)
    text = done.stdout + done.stderr
    for word in ("warnings summary", "Warning", "unclosed", "Exception ignored"):
        if word in text:
            sys.stdout.write(text[-6000:])
            raise SystemExit(f"[check_package] the matrix printed {word!r}")
    cells = json.loads((empty / "out.json").read_text())["cells"]
    got = sorted((c["id"], c["status"]) for c in cells)
    if got != [(cell, "valid") for cell in CELLS]:
        raise SystemExit(f"[check_package] cells {got}, expected {CELLS} all valid")
    last = done.stdout.strip().splitlines()[-1]
    print(f"[check_package] {last.strip('= ')}: {', '.join(CELLS)} valid")
    print(f"[check_package] all checks passed in {time.monotonic() - total:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args()
    if args.keep:
        if args.keep.exists():
            shutil.rmtree(args.keep)
        args.keep.mkdir(parents=True)
        run(args.keep.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="llmspeed-package-") as work:
            run(Path(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
