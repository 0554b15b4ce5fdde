"""Where digirl_lite finds its shipped data: the package's ``assets/`` folder, read through
:mod:`importlib.resources` so that it is the same for a checkout, an editable install and a
wheel (``$DIGIRL_LITE_DATA`` replaces it)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

__all__ = ["data_dir", "content_key", "atomic_write_text", "user_cache_dir", "fsync_tree",
           "fsync_dir", "FileLock", "lock_run_folder"]


def data_dir() -> Path:
    """``$DIGIRL_LITE_DATA`` if set, else the shipped ``digirl_lite/assets/`` folder (in the
    installed package): ``tasks/``, ``tokenizer/``, ``judge_examples/``, ``policies/``."""
    env = os.environ.get("DIGIRL_LITE_DATA")
    if env:
        return Path(env)
    return _assets()


@functools.cache
def _assets() -> Path:
    from importlib import resources

    root = resources.files("digirl_lite") / "assets"
    if not isinstance(root, Path):
        raise RuntimeError(f"digirl_lite's assets are not a folder on disk ({root!r}): install "
                           "the package unzipped, or point $DIGIRL_LITE_DATA at a copy")
    return root


def content_key(*parts: object) -> str:
    """A short stable name for what a cached artefact depends on (12 hex digits)."""
    import hashlib
    import json

    return hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(),
                           digest_size=6).hexdigest()


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` all at once (a temporary file, fsynced, then renamed)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def user_cache_dir() -> Path:
    """Where runs keep what they can rebuild (starting policies, piles) by default:
    ``$DIGIRL_LITE_CACHE``, else ``$XDG_CACHE_HOME/digirl_lite``, else
    ``~/.cache/digirl_lite`` (never a path relative to the working directory)."""
    env = os.environ.get("DIGIRL_LITE_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "digirl_lite"


def fsync_tree(root: Path) -> None:
    """Flush every file and folder under ``root`` (and ``root``) to disk, so a rename that
    publishes ``root`` afterwards never names half-written files after a power cut."""
    root = Path(root)
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename or a new file in it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileLock:
    """An advisory lock on ``path`` for this process: an exclusive ``flock`` on the file,
    which holds the holder's pid and host (for messages only). The system drops it when the
    process ends, however it ends, so a killed process never leaves a stale lock; a file
    left behind is taken over. On a system without ``fcntl`` (Windows) nothing is locked.

    ``acquire()`` returns None once this object holds the lock, else who holds it
    (``"process 123 on host h"``); ``release()`` deletes the file and drops the lock."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> str | None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return None
        if self._fd is not None:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: say by whom (the holder wrote it when it took the lock)
                holder = os.read(fd, 200).decode(errors="replace").split()
                os.close(fd)
                return (f"process {holder[0]} on host {holder[1]}" if len(holder) == 2
                        else "another process")
            try:  # a releaser deletes the file while it holds the lock: is ours still it?
                current = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                current = False
            if not current:
                os.close(fd)
                continue
            import socket

            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            self._fd = fd
            return None
        return "another process (the lock file kept changing)"

    def release(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)  # while still held: no one takes the old file
        os.close(self._fd)
        self._fd = None


def lock_run_folder(folder: str | Path) -> FileLock:
    """Take ``folder/run.lock`` for this process, or raise :class:`FolderBusyError` naming
    the live process that writes the folder (a run resumed while its first process still
    runs, or one folder given to two runs)."""
    from digirl_lite.errors import FolderBusyError

    lock = FileLock(Path(folder) / "run.lock")
    if (holder := lock.acquire()) is not None:
        raise FolderBusyError(f"{folder} is in use by {holder} (its lock {lock.path}): wait "
                              "for that run to end or stop it, or give another output folder")
    return lock
