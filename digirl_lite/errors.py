"""Errors every layer may raise (kept here, at the bottom, so no layer imports upwards)."""

from __future__ import annotations

__all__ = ["ConfigError", "FolderBusyError"]


class ConfigError(ValueError):
    """A configuration that cannot run (missing paths, bad values, a judge without its key,
    an unreachable device), raised before any work with the field or address named."""


class FolderBusyError(ConfigError):
    """A run folder another live process is writing (its ``run.lock`` is held): two runs in
    one folder would overwrite each other's checkpoints, so the second is refused."""
