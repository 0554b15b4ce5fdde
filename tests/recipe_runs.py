"""The main job's recipe as a subprocess, killed with SIGKILL at a moment of its output: the
kill -9 and ``--resume`` tests of the synchronous and the asynchronous learner share it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "offline_to_online.py"
SMALL = {"pile_size": 4, "eval_tasks": 2, "iterations": 1, "rollouts_per_iteration": 2,
         "n_envs": 2, "offline_critic_updates": 1, "critic_updates": 1,
         "offline_actor_updates": 1, "actor_updates": 1}
"""The smallest main job (``--quick`` plus these)."""


def kill_when(proc: subprocess.Popen, lines: list[str], markers: tuple[str, ...], delay: float,
              timeout: float = 600.0) -> None:
    """SIGKILL ``proc`` ``delay`` seconds after a stdout line containing any of ``markers``
    (after its start when there are none)."""
    t0 = time.time()
    while markers and not any(m in x for x in lines for m in markers):
        if proc.poll() is not None or time.time() - t0 > timeout:
            return
        time.sleep(0.05)
    time.sleep(delay)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)


def run_recipe(out: Path, resume: bool, markers: tuple[str, ...] = (), delay: float = 0.0,
               extra: tuple[str, ...] = ()) -> tuple[int, list[str]]:
    """Run the smallest main job into ``out`` (its own cache beside it), killed as
    :func:`kill_when` says when ``markers`` or ``delay`` are given: (return code, lines)."""
    cmd = [sys.executable, str(RECIPE), "--quick", "--out", str(out), "--set",
           *(f"{k}={v}" for k, v in SMALL.items()), "iterations=2", "eval_every=1",
           *extra, *(["--resume"] if resume else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "DIGIRL_LITE_CACHE": str(out.parent / f"cache-{out.name}")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=out.parent)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    if markers or delay:
        kill_when(proc, lines, markers, delay)
    proc.wait(timeout=900)
    reader.join(timeout=10)
    return proc.returncode, lines
