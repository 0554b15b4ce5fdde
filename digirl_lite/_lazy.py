"""Lazy exports: a package's names load their module (and torch, transformers, ...) on use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, where: dict[str, str]) -> tuple[Callable[[str], Any],
                                                                  Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``; ``where`` maps a name to its module
    (relative names are taken inside ``package``)."""

    def __getattr__(name: str) -> Any:
        mod = where.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        full = mod if mod.startswith("digirl_lite.") else f"{package}.{mod}"
        return getattr(importlib.import_module(full), name)

    def __dir__() -> list[str]:
        return sorted(where)

    return __getattr__, __dir__
