"""Named presets (the simulator's main job and its smoke run) and config files.

A preset only overrides field defaults; ``docs/config.md`` gives the measurements behind
each override.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from digirl_lite.errors import ConfigError
from digirl_lite.train.config.core import DigiRLConfig
from digirl_lite.train.config.run import WORLDS

__all__ = ["SHIPPED_SPLITS", "sim_webshop", "sim_quick", "load_config", "PRESETS"]

SHIPPED_SPLITS = {"webshop": ("unseen_products", "unseen_phrasings"),
                  "general": ("unseen_names", "unseen_phrasings")}
"""Each world's held-out split files (``tasks/<world>_<split>.txt``), evaluated by the
simulator preset (:func:`sim_webshop`)."""


def sim_webshop(**overrides: Any) -> DigiRLConfig:
    """The default simulated Web Shopping run (the main job): the paper's settings, from the
    shipped starting policy (``assets/policies/sft-<world>``, so the run skips SFT).

    Overrides: ``critic_lr`` 1e-3 and ``critic_hidden`` 256 (small critics on cached
    features), ``eval_every`` 5 (a learning-curve point every 80 trajectories) and, with the
    world's shipped test list, its held-out splits (:data:`SHIPPED_SPLITS`) at each stage
    end. docs/config.md says what each measured.
    """
    base: dict[str, Any] = {"starting_policy": "shipped", "critic_lr": 1e-3,
                            "critic_hidden": 256, "eval_every": 5}
    if not overrides.get("test_task_file"):
        base["eval_splits"] = SHIPPED_SPLITS.get(overrides.get("world", "webshop"), ())
    return DigiRLConfig(**{**base, **overrides})


def sim_quick(**overrides: Any) -> DigiRLConfig:
    """A few-minute smoke run of the whole pipeline (not for conclusions): the main job
    (:func:`sim_webshop`: the shipped starting policy, its settings) on a small budget, so
    its numbers mean something (the copier succeeds about as often as in the main job).
    Pass ``starting_policy="sft"`` (and ``sft_*`` fields) to train a starting policy. No
    held-out splits (``eval_splits``) unless asked for: a smoke run evaluates the test list."""
    base = {"pile_size": 24, "offline_critic_updates": 10, "offline_actor_updates": 10,
            "iterations": 2, "rollouts_per_iteration": 8, "n_envs": 8, "actor_updates": 4,
            "actor_batch": 32, "critic_batch": 32, "eval_tasks": 16, "max_new_tokens": 32,
            "eval_splits": ()}
    return sim_webshop(**{**base, **overrides})


PRESETS = {"sim_webshop": sim_webshop, "sim_quick": sim_quick, "paper": DigiRLConfig}
"""A config file's ``"preset"``: the simulator's main job, its smoke run, or the paper's
settings (the field defaults)."""


def _config_fields(p: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file's fields, on top of those of its ``"base"`` file (a path relative to
    it; bases may have bases); ``per_world`` merged world by world; "_comment" fields left
    out."""
    if not p.is_file():
        raise ConfigError(f"no config file {p}" + (f" (the base of {_seen[-1]})"
                                                    if _seen else ""))
    if p.resolve() in _seen:
        raise ConfigError(f"{p}: its bases lead back to it ({' -> '.join(map(str, _seen))})")
    try:
        d = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{p}: a config file is a JSON object of fields")
    d = {k: v for k, v in d.items() if not k.startswith("_")}  # "_comment" fields
    base = d.pop("base", None)
    if base is None:
        return d
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{p}: base must be a config file's path, got {base!r}")
    under = _config_fields(p.parent / base, (*_seen, p.resolve()))
    mine = d.get("per_world", {})
    if not isinstance(mine, dict):
        raise ConfigError(f"{p}: per_world must map a world name to a dict of fields, got "
                          f"{mine!r}")
    worlds = {**under.get("per_world", {})}
    for w, section in mine.items():
        worlds[w] = {**worlds.get(w, {}), **section} if isinstance(section, dict) else section
    out = {**under, **d}
    if worlds:
        out["per_world"] = worlds
    return out


def load_config(path: str | Path, preset: str | None = None,
                **overrides: Any) -> DigiRLConfig:
    """A JSON config file (DigiRLConfig fields; ``"preset": "sim_webshop" | "sim_quick" |
    "paper"`` picks the base, ``preset`` overrides it; ``"per_world": {world: {fields}}``
    adds the fields of the run's world; ``"base": "other.json"``, a file beside it whose
    fields it overrides), with ``overrides`` on top. Paths are checked
    (:meth:`DigiRLConfig.check_paths`)."""
    p = Path(path)
    d = _config_fields(p)
    preset = preset or d.pop("preset", "sim_webshop")
    d.pop("preset", None)
    base = PRESETS
    if preset not in base:
        raise ConfigError(f"{p}: unknown preset {preset!r} (one of {sorted(base)})")
    per_world = d.pop("per_world", {})
    if not isinstance(per_world, dict) or not all(
            isinstance(v, dict) for v in per_world.values()):
        raise ConfigError(f"{p}: per_world must map a world name to a dict of fields, got "
                          f"{per_world!r}")
    try:
        cfg = base[preset](**{**d, **overrides})
        unknown = sorted(set(per_world) - set(WORLDS))
        if unknown:
            raise ValueError(f"per_world names unknown worlds {unknown} (one of "
                             f"{', '.join(WORLDS)})")
        if per_world.get(cfg.world):
            cfg = base[preset](**{**d, **per_world[cfg.world], **overrides})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{p}: {e}") from None
    cfg.check_paths()
    return cfg
