"""Served phones in processes of their own: :func:`spawn_phones` starts them (each announces its
URL on stdout), :class:`PhoneProcess` is one of them."""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["PhoneProcess", "spawn_phones", "URL_LINE", "ends_with_parent"]

URL_LINE = "digirl-sim-phone listening on "
"""The start of the one line the server prints; the URL follows."""


class PhoneProcess:
    """A served phone in a child process (see :func:`spawn_phones`). ``kill()`` and
    ``close()`` end this process only."""

    def __init__(self, proc: subprocess.Popen, url: str, stderr: Any) -> None:
        self.proc, self.url, self._stderr = proc, url, stderr

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_text(self) -> str:
        """What the phone wrote to stderr so far (tracebacks, argument errors)."""
        if self._stderr.closed:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL: the device is lost, mid-request or not."""
        if self.alive():
            self.proc.kill()
        self._reap()

    def close(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()

    def _reap(self) -> None:
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> PhoneProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _cli_value(value: Any) -> str:
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    return json.dumps(value) if isinstance(value, dict) else str(value)


def _read_urls(procs: list[subprocess.Popen], deadline: float) -> list[str | None]:
    """The URL each process printed (None: it exited first), read until ``deadline``."""
    sel = selectors.DefaultSelector()
    bufs: dict[int, bytes] = {}
    urls: list[str | None] = [None] * len(procs)
    for i, p in enumerate(procs):
        sel.register(p.stdout, selectors.EVENT_READ, i)
        bufs[i] = b""
    try:
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                i = key.data
                chunk = os.read(key.fd, 4096)
                bufs[i] += chunk
                if b"\n" in bufs[i] or not chunk:
                    sel.unregister(key.fileobj)
                    line = bufs[i].split(b"\n", 1)[0].decode(errors="replace")
                    if line.startswith(URL_LINE):
                        urls[i] = line[len(URL_LINE):].strip()
    finally:
        sel.close()
    return urls


def ends_with_parent() -> Any:
    """A ``preexec_fn`` for ``subprocess.Popen`` that makes the child end (SIGTERM) when the
    process that started it dies, even by SIGKILL, so a served phone is never left behind
    (Linux's ``PR_SET_PDEATHSIG``; None elsewhere: the child is then ended only by
    ``close``/``stop``). Linux sends that signal when the *thread* that forked ends, so off
    the main thread (a worker that may finish before the phone should) it is None too."""
    import threading

    if not sys.platform.startswith("linux") or \
            threading.current_thread() is not threading.main_thread():
        return None
    import ctypes
    import signal

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in it
    parent, sigterm = os.getpid(), int(signal.SIGTERM)

    def preexec() -> None:
        prctl(1, sigterm)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)

    return preexec


def spawn_phones(n: int, world: str = "webshop", seed: int = 0, *, timeout_s: float = 60.0,
                 ports: Sequence[int] | None = None, **kw: Any) -> list[PhoneProcess]:
    """Start ``n`` served phones, each in its own process on a free port.

    Phone ``i`` is seeded ``seed + i`` (as ``SimEnvFactory`` seeds slots). The processes
    start together and each announces its URL on stdout.

    Args:
        n: how many phones.
        world, seed: as :class:`SimPhoneServer`.
        timeout_s: how long to wait for all of them to listen.
        ports: phone ``i`` listens on ``ports[i]`` (e.g. a phone restarted where a lost one
            was, issue 29); None: each on a free port.
        **kw: more :class:`SimPhoneServer` options (``day``, ``surprises``, ``faults``,
            ``crash_down_s``, ``width``, ``height``, ``host``, ``screen_cache``,
            ``max_body_bytes``).

    Returns:
        One :class:`PhoneProcess` per phone; close them (they are not ended for you).

    Raises:
        RuntimeError: a phone exited or did not listen within ``timeout_s`` (its stderr is
            in the message); the phones already started are closed first.
    """
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if ports is not None and len(ports) != n:
        raise ValueError(f"ports must name {n} ports, got {len(ports)}")
    root = str(Path(__file__).resolve().parents[4])  # the child imports this checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    extra = [a for k, v in kw.items() for a in (f"--{k.replace('_', '-')}", _cli_value(v))]
    procs, errs = [], []
    for i in range(n):
        port = str(ports[i]) if ports is not None else "0"
        argv = [sys.executable, "-m", "digirl_lite.envs.sim.serve", "--port", port,
                "--world", world, "--seed", str(seed + i), *extra]
        errs.append(tempfile.TemporaryFile())
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errs[-1], env=env,
                                      preexec_fn=ends_with_parent()))
    urls = _read_urls(procs, time.monotonic() + timeout_s)
    phones = [PhoneProcess(p, u or "", e) for p, u, e in zip(procs, urls, errs)]
    bad = [i for i, u in enumerate(urls) if u is None]
    if bad:
        i = bad[0]
        try:  # its stdout closed (it is exiting) or the deadline passed
            why = f"exited with code {procs[i].wait(timeout=2.0)}"
        except subprocess.TimeoutExpired:
            why = f"did not listen within {timeout_s:g} s"
        detail = phones[i].stderr_text().strip()[-2000:]
        for phone in phones:
            phone.close()
        raise RuntimeError(f"{len(bad)} of {n} simulated phones failed to start; phone {i} "
                           f"{why}:\n{detail or '(nothing on stderr)'}")
    return phones
