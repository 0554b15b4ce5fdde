"""Where digirl_lite finds its shipped data: the package's ``assets/`` folder, read through
:mod:`importlib.resources` so that it is the same for a checkout, an editable install and a
wheel (``$DIGIRL_LITE_DATA`` replaces it)."""

from __future__ import annotations

import functools
import os
import threading
import warnings
from pathlib import Path
from typing import Any

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


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` all at once, in UTF-8 whatever the locale: a temporary file
    of its own name in the same folder (``.<name>.<pid>.<random>.tmp``), fsynced, then
    renamed over ``path``. A reader sees the old content or the new, never a part; on any
    error (a text that does not encode, a full disk, an interrupt) the temporary file is
    removed, ``path`` is left as it was and the error is raised. The file gets the
    permissions ``open()`` would give it (0o666 less the umask), not a temporary file's
    0o600."""
    import secrets

    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
    left behind is taken over. Where the file system cannot lock (no ``fcntl`` on Windows,
    some network mounts) ``acquire()`` warns and goes on unlocked.

    The lock is the process's: a second ``FileLock`` of the same path in the process that
    holds it shares it (a notebook cell run again builds its object before the old one is
    dropped), and the file is let go when the last of them releases.

    ``acquire()`` returns None once this object holds the lock (or cannot lock), else who
    holds it (``"process 123 on host h"``); ``release()`` deletes the file and drops the
    lock; ``fileno()`` is the locked file's descriptor (a child process given it, as with
    ``subprocess.Popen(pass_fds=...)``, keeps the lock alive while it runs)."""

    _mine: dict[str, list[int]] = {}  # path -> [fd, holders]: this process's locks
    _guard = threading.RLock()  # re-entrant: the collector may run __del__ inside acquire

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._key = os.path.abspath(self.path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path} is not held")
        return self._fd

    def acquire(self) -> str | None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            warnings.warn(f"{self.path}: no fcntl here, the folder is not locked", stacklevel=2)
            return None
        with self._guard:
            if self._fd is not None:
                return None
            if (mine := self._mine.get(self._key)) is not None:
                mine[1] += 1
                self._fd = mine[0]
                return None
            return self._take(fcntl)

    def _take(self, fcntl: Any) -> str | None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held: say by whom (the holder wrote it on taking it)
                holder = os.read(fd, 200).decode(errors="replace").split()
                os.close(fd)
                return (f"process {holder[0]} on host {holder[1]}" if len(holder) == 2
                        else "another process")
            except OSError as e:  # a file system that cannot lock: say so, go on
                os.close(fd)
                warnings.warn(f"{self.path}: cannot lock here ({e}): nothing stops a second "
                              "process from writing the same folder", stacklevel=2)
                return None
            if not self._is_path(fd):  # a releaser deleted it while we waited: retry
                os.close(fd)
                continue
            import socket

            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            self._fd = fd
            self._mine[self._key] = [fd, 1]
            return None
        return "another process (the lock file kept changing)"

    def _is_path(self, fd: int) -> bool:
        """Whether ``fd`` is still the file named ``path``."""
        try:
            mine, named = os.fstat(fd), os.stat(self.path)
        except FileNotFoundError:
            return False
        return (mine.st_dev, mine.st_ino) == (named.st_dev, named.st_ino)

    def release(self) -> None:
        with self._guard:
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
            mine = self._mine[self._key]
            mine[1] -= 1
            if mine[1]:
                return  # another object of this process still holds it
            del self._mine[self._key]
            if self._is_path(fd):  # deleted while still held: no one takes the old file
                self.path.unlink(missing_ok=True)
            os.close(fd)

    def __del__(self) -> None:  # an object dropped unreleased (a notebook) frees its folder
        try:
            self.release()
        except Exception:  # pragma: no cover - at interpreter exit, os may be gone
            pass


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
