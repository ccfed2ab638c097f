"""The tree passes the lint configured in pyproject.toml ([tool.ruff]): undefined names, unused imports and
pycodestyle's errors fail here, not in review."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing_in_the_tree() -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "runner", "phase", "scripts", "tests"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
