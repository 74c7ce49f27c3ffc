#!/usr/bin/env python3
"""Install a real browser for the page tests: Debian's ``chromium`` (headless).

Standard library only; the test command runs it before the tests, as it runs setup_vllm.py:

    python scripts/setup_browser.py          # install when missing (about 30 s), else nothing
    python scripts/setup_browser.py --check  # say whether it is there (exit 0) or not (exit 1)

It installs only as root, with apt-get, from Debian's packages (no browser download by a test
tool). Where it cannot (not root, no apt-get, no network), it says why and exits 0: the page
tests then skip with that reason, everything else runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

NAMES = ("chromium", "chromium-browser")


def find() -> str | None:
    return next((p for p in map(shutil.which, NAMES) if p), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    found = find()
    if found or args.check:
        print(f"[setup_browser] {'found ' + found if found else 'no chromium on PATH'}")
        return 0 if found else 1
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print(
            "[setup_browser] cannot install chromium here (needs root and apt-get): page tests skip"
        )
        return 0
    print("[setup_browser] apt-get install chromium (about 30 s)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "install", "-y", "-q", "chromium"], ["apt-get", "update", "-q"]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if cmd[1] == "install" and done.returncode == 0:
            break
        if cmd[1] == "update" and done.returncode == 0:  # stale lists: update, then once more
            done = subprocess.run(
                ["apt-get", "install", "-y", "-q", "chromium"],
                env=env,
                capture_output=True,
                text=True,
            )
            break
    if done.returncode != 0:
        print(f"[setup_browser] apt-get failed ({done.returncode}): {done.stderr.strip()[-300:]}")
        return 0
    print(f"[setup_browser] installed {find()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
