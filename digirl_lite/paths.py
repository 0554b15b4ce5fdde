"""Where digirl_lite finds its shipped data (``data/`` at the repository root)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_dir"]


def data_dir() -> Path:
    """``$DIGIRL_LITE_DATA`` if set, else the repository's ``data/`` folder."""
    env = os.environ.get("DIGIRL_LITE_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / "data"
