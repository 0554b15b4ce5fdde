"""The checkout a grid runs in: its root, where the grid specs, runs and results live, and
git there.

Every module of the package reads :data:`ROOT` from here when it runs (``repo.ROOT``), so
that a test can point the whole grid at a repository of its own
(``monkeypatch.setattr(repo, "ROOT", path)``); the folders below it are fixed on import.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRIDS = ROOT / "benchmarks" / "grids"
RUNS = ROOT / "runs" / "grid"
RESULTS = ROOT / "benchmarks" / "results" / "grid"


def _rel(p: Path) -> str:
    p = Path(os.path.abspath(p))
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def _git(*args: str) -> str:
    p = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else ""


def _git_or_none(*args: str) -> str | None:
    """git's output, or None where it fails (not a checkout, an unknown commit or path)."""
    p = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else None
