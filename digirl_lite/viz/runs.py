"""Read a run folder written by :class:`digirl_lite.train.Trainer`.

    RUN/metrics.jsonl             one JSON record per line; ``stage`` says what it logs
                                  ("sft", "pile", "offline", "online", "eval:<stage>", ...)
    RUN/summary.json              config, per-stage evaluation summaries (at the end of a run)
    RUN/store/                    every pile and online trajectory (a TrajectoryStore)
    RUN/eval/<stage>/             the evaluation episodes of one stage (a TrajectoryStore);
                                  RUN/eval/<stage>-<split>/ those of a held-out split
    RUN/checkpoints/latest        the newest checkpoint's name; checkpoints/iter-NNNN/state.pt
                                  holds the critics' state dicts

Everything is read lazily and tolerates a run still in progress: no summary yet, no eval
folder, no checkpoint. Nothing here imports torch except :meth:`Run.critic_state`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import ScreenTable, Trajectory

__all__ = ["EVAL_PREFIX", "EvalPoint", "Run", "load_runs"]

EVAL_PREFIX = "eval:"
"""Evaluation records in metrics.jsonl have ``stage = "eval:<stage name>"`` (a held-out
split's, ``"eval:<stage name>:<split>"``)."""


@dataclass(frozen=True)
class EvalPoint:
    """One point of a learning curve: held-out success after ``online_trajectories``."""

    stage: str
    online_trajectories: int
    success_rate: float
    ci95: tuple[float, float]
    mean_length: float | None = None


class Run:
    """A run folder. ``Run("runs/webshop")``.

    Args:
        path: the folder the Trainer wrote (``out_dir``).
        name: a display name (default: the folder's name).
    """

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"run folder {self.path} does not exist")
        if not (self.path / "metrics.jsonl").is_file() and not (
                self.path / "summary.json").is_file():
            raise FileNotFoundError(f"{self.path} is not a run folder (no metrics.jsonl and no "
                                    "summary.json)")
        self.name = name or self.path.name

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    # -- records --------------------------------------------------------------------------
    def metrics(self) -> list[dict[str, Any]]:
        """Every record of metrics.jsonl, in order. A torn last line (a run killed while
        writing) is skipped; a bad line elsewhere raises, naming it."""
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return []
        lines = path.read_text().splitlines()
        out = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                if i == len(lines) - 1:
                    break
                raise ValueError(f"{path}:{i + 1} is not JSON: {e}") from e
        return out

    def summary(self) -> dict[str, Any] | None:
        """summary.json (written at the end of a run), else the one the newest checkpoint
        carries (a run in progress), else None."""
        path = self.path / "summary.json"
        if path.is_file():
            return json.loads(path.read_text())
        ckpt = self.latest_checkpoint()
        if ckpt is not None and (ckpt / "state.json").is_file():
            return json.loads((ckpt / "state.json").read_text()).get("summary")
        return None

    @property
    def config(self) -> dict[str, Any]:
        """The run's config (``DigiRLConfig.as_dict()``), or {} when none is written yet."""
        s = self.summary()
        return dict(s.get("config", {})) if s else {}

    @property
    def label(self) -> str:
        """``"<algorithm> seed <seed>"`` from the config, else the folder name."""
        c = self.config
        if "algorithm" in c and "seed" in c:
            return f"{c['algorithm']} seed {c['seed']}"
        return self.name

    def curve(self) -> list[EvalPoint]:
        """The learning curve: every evaluation record of metrics.jsonl, in order (a
        held-out split's, ``eval:<stage>:<split>``, is in its stage's summary instead)."""
        pts = []
        for r in self.metrics():
            stage = str(r.get("stage", ""))
            if (stage.startswith(EVAL_PREFIX) and "success_rate" in r
                    and ":" not in stage[len(EVAL_PREFIX):]):
                ci = r.get("ci95") or (float("nan"), float("nan"))
                pts.append(EvalPoint(stage[len(EVAL_PREFIX):], int(r.get("online_trajectories", 0)),
                                     float(r["success_rate"]), (float(ci[0]), float(ci[1])),
                                     r.get("mean_length")))
        return pts

    def series(self, key: str, stage: str = "online", x: str = "online_trajectories"
               ) -> tuple[list[float], list[float]]:
        """(xs, ys) of ``key`` over the records of ``stage`` that have both ``x`` and ``key``
        (e.g. ``run.series("kept_steps")``, ``run.series("actor_loss")``)."""
        xs, ys = [], []
        for r in self.metrics():
            if r.get("stage") == stage and key in r and x in r and r[key] is not None:
                xs.append(float(r[x]))
                ys.append(float(r[key]))
        return xs, ys

    def stage_table(self) -> list[dict[str, Any]]:
        """One row per evaluated stage: the summary's reports (with the learning curve's
        x), or, before summary.json exists, the evaluation records of metrics.jsonl."""
        s = self.summary() or {}
        x_of = {p.stage: p.online_trajectories for p in self.curve()}
        stages = s.get("stages") or {}
        if stages:
            return [{"stage": k, "online_trajectories": x_of.get(k), **v}
                    for k, v in stages.items()]
        return [{"stage": p.stage, "online_trajectories": p.online_trajectories,
                 "success_rate": p.success_rate, "ci95": list(p.ci95),
                 "mean_length": p.mean_length} for p in self.curve()]

    # -- trajectories ---------------------------------------------------------------------
    def eval_stages(self) -> list[str]:
        """Stages whose evaluation episodes are stored (``RUN/eval/<stage>/``), in the order
        they were evaluated (the learning curve's order; unknown ones last, by name)."""
        root = self.path / "eval"
        if not root.is_dir():
            return []
        from digirl_lite.data.store import MANIFEST

        present = {p.name for p in root.iterdir() if (p / MANIFEST).is_file()}
        order = [p.stage for p in self.curve() if p.stage in present]
        seen = set(order)
        return list(dict.fromkeys(order)) + sorted(present - seen)

    def eval_trajectories(self, stage: str, with_images: bool = True
                          ) -> tuple[list[Trajectory], ScreenTable]:
        """The evaluation episodes of ``stage`` and their screens."""
        from digirl_lite.data.store import load_trajectories

        path = self.path / "eval" / stage
        if not path.is_dir():
            have = ", ".join(self.eval_stages()) or "none"
            raise FileNotFoundError(f"{self.path} has no stored evaluation for stage {stage!r} "
                                    f"(stored: {have})")
        return load_trajectories(path, with_images=with_images)

    def trajectories(self, with_images: bool = True) -> tuple[list[Trajectory], ScreenTable]:
        """Every pile and online trajectory of the run (``RUN/store``)."""
        from digirl_lite.data.store import load_trajectories

        return load_trajectories(self.path / "store", with_images=with_images)

    # -- checkpoints ----------------------------------------------------------------------
    def latest_checkpoint(self) -> Path | None:
        """The newest checkpoint folder (``checkpoints/latest``), or None."""
        latest = self.path / "checkpoints" / "latest"
        if not latest.is_file():
            return None
        d = self.path / "checkpoints" / latest.read_text().strip()
        return d if d.is_dir() else None

    def critic_state(self, checkpoint: str | os.PathLike[str] | None = None
                     ) -> dict[str, Any] | None:
        """The tensors of ``checkpoint/state.pt`` (default: the newest), or None if there is
        no checkpoint. Loaded with ``weights_only=True`` on the CPU."""
        d = Path(checkpoint) if checkpoint is not None else self.latest_checkpoint()
        if d is None:
            return None
        import torch

        return torch.load(d / "state.pt", map_location="cpu", weights_only=True)


def load_runs(paths: list[str | os.PathLike[str]] | str | os.PathLike[str]) -> list[Run]:
    """:class:`Run` objects for ``paths``: a list of run folders, or one folder holding run
    folders (every subfolder with a metrics.jsonl or summary.json, by name)."""
    if isinstance(paths, (str, os.PathLike)):
        root = Path(paths)
        if (root / "metrics.jsonl").is_file() or (root / "summary.json").is_file():
            return [Run(root)]
        subs = sorted(p for p in root.iterdir() if p.is_dir() and (
            (p / "metrics.jsonl").is_file() or (p / "summary.json").is_file()))
        if not subs:
            raise FileNotFoundError(f"{root} holds no run folders")
        return [Run(p) for p in subs]
    return [Run(p) for p in paths]
