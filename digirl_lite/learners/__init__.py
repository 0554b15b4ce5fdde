"""The learners: what each algorithm does with the pile (the offline phase) and with an online
iteration's data, one file each, behind :class:`~digirl_lite.learners.base.Learner`.

The :class:`~digirl_lite.train.Trainer` is the loop (starting policy, pile, offline phase,
online iterations, evaluations, checkpoints); its learner is the update:

- :mod:`~digirl_lite.learners.digirl`: DigiRL's filtered imitation (both critics, Eq. 4.4's
  instruction filter, Eq. 4.3's step filter, Eq. 4.2's maximum likelihood);
- :mod:`~digirl_lite.learners.filtered_bc`: the paper's baseline (every success, no critics);
- :mod:`~digirl_lite.learners.awr`: Eq. 4.1's ablation (every step, weighted);
- :mod:`~digirl_lite.learners.ppo`: Darwin's token-level PPO with GAE and a value head;
- :mod:`~digirl_lite.learners.grpo`: GRPO (group-standardised rewards, no value head).

A new learner is one new file: a :class:`~digirl_lite.learners.base.Learner` subclass that
registers itself (``@register("name")``) and declares what the run needs from it (its config
fields and checks, its critics, its tasks' draw, whether it runs data parallel, its
checkpoint state). The modules of this folder register on the first look-up; a learner
defined elsewhere registers when its module is imported.
"""

from __future__ import annotations

import pkgutil
from importlib import import_module
from typing import TYPE_CHECKING, TypeVar

from digirl_lite.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.learners.base import Learner

__all__ = ["register", "learner_class", "learner_names", "make_learner"]

L = TypeVar("L", bound="type[Learner]")

_REGISTRY: dict[str, type] = {}
_loaded = False


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register(name: str, cls: L | None = None):
    """Register ``cls`` as the learner of ``algorithm=name`` (as a decorator:
    ``@register("name")``); sets its ``name``.

    Raises:
        ValueError: ``name`` is another class's already (both named). The same class again
            (a module imported twice, reloaded) replaces itself.
    """
    def add(c: L) -> L:
        if not c.__module__.startswith(f"{__name__}."):  # a clash with a built-in one, too
            _load_builtin()
        old = _REGISTRY.get(name)
        if old is not None and _qualname(old) != _qualname(c):
            raise ValueError(f"learner {name!r} is registered to {_qualname(old)}; "
                             f"{_qualname(c)} cannot take the same name")
        c.name = name
        _REGISTRY[name] = c
        return c

    return add if cls is None else add(cls)


def _load_builtin() -> None:
    """Import every module of this folder once (they register themselves)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for m in pkgutil.iter_modules(__path__):
        if m.name != "base" and not m.name.startswith("_"):
            import_module(f"{__name__}.{m.name}")


def learner_names() -> tuple[str, ...]:
    """Every registered ``algorithm``, the built-in ones first (in registration order)."""
    _load_builtin()
    return tuple(_REGISTRY)


def learner_class(name: str) -> type[Learner]:
    """The learner registered as ``name``.

    Raises:
        ConfigError: no learner has that name (the field and the known names given).
    """
    _load_builtin()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ConfigError(f"algorithm must be one of {learner_names()}, got {name!r}"
                          ) from None


def make_learner(run) -> Learner:
    """The learner of ``run.cfg.algorithm`` for the run ``run`` (a Trainer)."""
    return learner_class(run.cfg.algorithm)(run)
