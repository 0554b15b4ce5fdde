"""What a test needs from outside the package, and what happens when it is missing.

Outside CI a missing optional piece (an extra's package, Appium in ``.ci/node``, Chromium, the
real AitW lists beside the checkout) skips the tests that need it, saying which and how to get
it. Under ``CI=true`` it fails them instead: CI installs everything (``.ci/run``), so a skip
there means something did not run. ``tests/conftest.py`` turns any other skip into a failure
under CI too.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the real AitW instruction lists live beside the checkout (``../shared/data/aitw_tasks``)
AITW = ROOT.parent / "shared" / "data" / "aitw_tasks"


def in_ci() -> bool:
    """``CI`` set to a true value (GitHub Actions and most CI services set ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def missing(reason: str) -> NoReturn:
    """Skip with ``reason`` outside CI; fail with it under ``CI=true``."""
    if in_ci():
        pytest.fail(f"CI=true and {reason}: CI must run this test, not skip it",
                    pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def optional_import(name: str, how: str = 'pip install -e ".[dev]"'):
    """Import a third-party optional package; missing: a skip outside CI (saying ``how`` to
    get it), a failure under CI. Never for digirl_lite's own modules: import those plainly,
    so that an import error in the package fails its tests."""
    if name == "digirl_lite" or name.startswith("digirl_lite."):
        raise ValueError("import digirl_lite's own modules plainly, never optionally")
    try:
        return importlib.import_module(name)
    except ImportError as e:
        why = f"the optional package {name!r} is not importable ({e}; {how})"
    missing(why)


def aitw_dir() -> Path:
    """The real AitW instruction lists (``../shared/data/aitw_tasks``), or a skip (outside
    CI) / failure (under CI) that says where they should be."""
    if not AITW.is_dir():
        missing(f"the real AitW lists are not at {AITW} (they live beside the repository, "
                "in ../shared/data/aitw_tasks)")
    return AITW


def aitw_file(name: str) -> Path:
    path = aitw_dir() / name
    if not path.is_file():
        missing(f"{path} is absent (the AitW lists live beside the repository, in "
                "../shared/data/aitw_tasks)")
    return path


def network_off(mp: pytest.MonkeyPatch) -> None:
    """Switch the Hugging Face hub off and refuse every socket connection (for loading the
    shipped models: nothing may download)."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access attempted")

    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    mp.setattr(socket.socket, "connect", refuse)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released): for a server a test
    starts, or for a client that must meet a refused connection."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_HOLD = ("import sys; from digirl_lite.paths import FileLock; l = FileLock(sys.argv[1]); "
         "assert l.acquire() is None; print('held', flush=True); sys.stdin.read()")


def hold(path: Path) -> subprocess.Popen:
    """Another live process holding the :class:`~digirl_lite.paths.FileLock` at ``path``
    (it holds it until its stdin closes)."""
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p
