"""Import and export of DigiRL's released trajectory files.

The reference code stores a pile as a pickled (``torch.save``) list of trajectories, each a
list of step dicts with keys ``observation`` (the prompt), ``next_observation``,
``image_features`` (two frames, 2 x 1408 floats), ``next_image_features``, ``action``,
``reward``, ``done``, ``mc_return``, ``trajectory_reward``, ``image_path`` (and, in some
files, ``task``).

Unpickling runs code chosen by whoever wrote the file, so :func:`import_released` refuses to
open one unless the caller passes ``allow_pickle=True`` for a file they trust. Export writes
the same layout (with ``torch.save`` for ``.pt`` files, else pickle) so results can be fed to
the reference code.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from digirl_lite.actions import ActionType
from digirl_lite.data.records import Ending, ScreenTable, Source, Step, Trajectory, Verdict
from digirl_lite.prompts import task_from_prompt

__all__ = ["BLIP2_DIM", "import_released", "export_released", "UnsafeFileError"]

BLIP2_DIM = 1408
"""Pooled BLIP-2 ViT-g feature size (released code)."""

REQUIRED_KEYS = ("observation", "action", "reward", "done", "image_features")


class UnsafeFileError(PermissionError):
    """Opening this file would unpickle it; pass ``allow_pickle=True`` if you trust it."""


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=np.float32).reshape(-1)


def _last_frame(x: Any, d: int, where: str) -> np.ndarray:
    a = _to_numpy(x)
    if a.shape[0] == 2 * d:
        return a[d:]
    if a.shape[0] == d:
        return a
    raise ValueError(f"{where}: image features have {a.shape[0]} floats; expected {d} (one "
                     f"frame) or {2 * d} (two frames). Set feature_dim if yours differ.")


def _read(path: Path) -> Any:
    if zipfile.is_zipfile(path):  # torch.save's format
        try:
            import torch
        except ImportError as e:  # pragma: no cover - torch is a core dependency
            raise ImportError("reading a torch.save file needs torch") from e
        return torch.load(path, map_location="cpu", weights_only=False)  # opt-in, see caller
    with open(path, "rb") as f:
        return pickle.load(f)  # opt-in, see caller


def import_released(
    path: str | os.PathLike[str],
    *,
    allow_pickle: bool = False,
    feature_dim: int = BLIP2_DIM,
    horizon: int = 20,
    source: Source = Source.OFFLINE,
    load_images: bool = False,
    id_prefix: str | None = None,
) -> tuple[list[Trajectory], ScreenTable]:
    """Read a released DigiRL trajectory file into typed trajectories and a screen table.

    Args:
        path: a ``torch.save`` / pickle file holding a list of lists of step dicts.
        allow_pickle: required: the file is unpickled, which executes code it contains.
        feature_dim: floats per frame (1408 for BLIP-2).
        horizon: the step budget the file was collected with (20 Web Shopping, 10 General).
        source: recorded on every trajectory.
        load_images: read the PNG at each step's ``image_path`` when it exists.
        id_prefix: trajectory ids become ``{prefix}-{index}`` (default: the file stem).

    Raises:
        UnsafeFileError: without ``allow_pickle``.
        ValueError: for a file of another layout, naming the trajectory and step.
    """
    p = Path(path)
    if not allow_pickle:
        raise UnsafeFileError(
            f"refusing to unpickle {p}: DigiRL's released trajectory files are pickles, and "
            "unpickling runs code from the file. If you trust it, pass allow_pickle=True."
        )
    data = _read(p)
    if not isinstance(data, list):
        raise ValueError(f"{p}: expected a list of trajectories, got {type(data).__name__}")
    prefix = id_prefix or p.stem
    screens = ScreenTable(feature_dim)
    out: list[Trajectory] = []
    for ti, raw in enumerate(data):
        where_t = f"{p}: trajectory {ti}"
        if not isinstance(raw, list):
            raise ValueError(f"{where_t}: expected a list of step dicts, got {type(raw).__name__}")
        steps: list[Step] = []
        task = None
        for si, d in enumerate(raw):
            where = f"{where_t}, step {si}"
            if not isinstance(d, dict):
                raise ValueError(f"{where}: expected a dict, got {type(d).__name__}")
            missing = [k for k in REQUIRED_KEYS if k not in d]
            if missing:
                raise ValueError(f"{where}: missing keys {missing}")
            prompt = str(d["observation"])
            task = d.get("task") or task_from_prompt(prompt) or ""
            cur = _last_frame(d["image_features"], feature_dim, where)
            img_path = d.get("image_path")
            image = None
            if load_images and img_path and Path(img_path).is_file():
                from PIL import Image

                with Image.open(img_path) as im:
                    image = im.convert("RGB")
            sid = screens.add(features=cur, source_path=str(img_path) if img_path else None)
            if image is not None:
                screens.add(image, screen_id=sid)
            if "next_image_features" in d and d["next_image_features"] is not None:
                nxt = _last_frame(d["next_image_features"], feature_dim, where)
                nsid = screens.add(features=nxt)
            else:
                nsid = sid  # unknown; the next step's screen is patched in below
            steps.append(Step.from_text(
                task=task, prompt=prompt, action_text=str(d["action"]),
                reward=float(d["reward"]), done=bool(d["done"]), screen_id=sid,
                next_screen_id=nsid, mc_return=float(d.get("mc_return", 0.0)),
                verdict=d.get("verdict"),  # written by export_released; absent upstream
            ))
        for si in range(len(steps) - 1):  # where next_image_features was absent
            if raw[si].get("next_image_features") is None:
                steps[si] = replace(steps[si], next_screen_id=steps[si + 1].screen_id)
        if not steps:
            continue
        final = float(raw[-1].get("trajectory_reward", sum(s.reward for s in steps)))
        final = 1.0 if final > 0 else 0.0
        if final > 0:
            ending = Ending.SUCCESS
        elif steps[-1].action.action_type in (ActionType.STATUS_TASK_COMPLETE,
                                              ActionType.TASK_IMPOSSIBLE):
            ending = Ending.AGENT_STOP
        elif len(steps) >= horizon:
            ending = Ending.BUDGET
        else:
            # The reference environment ends an episode early only on success, a stop action
            # or an exception; with neither of the first two, it was the infrastructure.
            ending = Ending.INFRA
        out.append(Trajectory(
            traj_id=f"{prefix}-{ti}", task=task or "", steps=tuple(steps), final_reward=final,
            ending=ending, source=source, iteration=-1, horizon=horizon,
            truncation_reason=(f"{p.name}: ended after {len(steps)} of {horizon} steps with "
                               "no success and no stop action") if ending is Ending.INFRA
            else None,
        ))
    return out, screens


def export_released(
    trajectories: Sequence[Trajectory], screens: ScreenTable, path: str | os.PathLike[str],
) -> Path:
    """Write ``trajectories`` in the released layout (``.pt``: torch.save; else pickle).

    Two-frame ``image_features`` are rebuilt from the screen table (first frame repeated);
    ``trajectory_reward`` is the final reward; infrastructure truncations are skipped, as the
    reference code has no way to mark them. Steps whose screens lack features get ``None``.
    """
    p = Path(path)
    data: list[list[dict[str, Any]]] = []
    for t in trajectories:
        if t.is_infra_truncated or not t.steps:
            continue
        prev, cur = t.state_frames()
        have = all(screens.has_features(s) for s in set(prev) | set(cur))
        stacked = screens.stack(prev, cur) if have else None
        rows = []
        for h, s in enumerate(t.steps):
            nxt_prompt = t.steps[h + 1].prompt if h + 1 < len(t.steps) else s.prompt
            rows.append({
                "observation": s.prompt, "next_observation": nxt_prompt,
                "image_features": None if stacked is None else stacked[h].copy(),
                "next_image_features": None if stacked is None else stacked[h + 1].copy(),
                "image_path": screens.source_path(s.screen_id),
                "task": t.task, "action": s.action_text, "reward": float(s.reward),
                "done": bool(s.done), "mc_return": float(s.mc_return),
                "trajectory_reward": float(t.final_reward),
                "verdict": s.verdict.value if isinstance(s.verdict, Verdict) else None,
            })
        data.append(rows)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".pt":
        import torch

        torch.save(data, p)
    else:
        with open(p, "wb") as f:
            pickle.dump(data, f)
    return p
