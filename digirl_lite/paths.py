"""Where digirl_lite finds its shipped data (``data/`` at the repository root)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_dir", "content_key", "atomic_write_text"]


def data_dir() -> Path:
    """``$DIGIRL_LITE_DATA`` if set, else the repository's ``data/`` folder."""
    env = os.environ.get("DIGIRL_LITE_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / "data"


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
