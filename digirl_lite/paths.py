"""Where digirl_lite finds its shipped data: the package's ``assets/`` folder, read through
:mod:`importlib.resources` so that it is the same for a checkout, an editable install and a
wheel (``$DIGIRL_LITE_DATA`` replaces it)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

__all__ = ["data_dir", "content_key", "atomic_write_text", "user_cache_dir", "fsync_tree",
           "fsync_dir"]


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
