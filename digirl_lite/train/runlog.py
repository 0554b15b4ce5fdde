"""What a run says and records: one line per phase and progress bars on a terminal,
``metrics.jsonl`` (and TensorBoard with ``tensorboard``), the time each phase takes
(``timings``), ``summary.json`` and the learning curve (``learning_curve.png``).

A mixin of :class:`~digirl_lite.train.trainer.Trainer`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from digirl_lite.paths import atomic_write_text
from digirl_lite.provenance import environment
from digirl_lite.redaction import redact

__all__ = ["RunLog", "tensorboard_writer"]


def tensorboard_writer(out: Path) -> Any:
    """A TensorBoard ``SummaryWriter`` on ``out/tensorboard`` (``tensorboard=True``)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError("tensorboard=True needs the 'tensorboard' extra: "
                          "pip install 'digirl-lite[tensorboard]'") from e
    return SummaryWriter(str(out / "tensorboard"))


class RunLog:
    """The run's log (mixed into :class:`~digirl_lite.train.trainer.Trainer`)."""

    def iterate(self, n: int, desc: str):
        """``range(n)`` with a progress bar when the phase is long enough to watch (part of
        the learners' interface, :class:`digirl_lite.learners.base.Run`)."""
        if n < 20:
            yield from range(n)
            return
        with self._bar(n, desc) as bar:
            for i in range(n):
                yield i
                bar.update()

    def _bar(self, total: int, desc: str, unit: str = "it"):
        """A one-line progress bar for one phase (tqdm): only on a terminal, only on process
        0, never without ``progress`` (elsewhere :meth:`say` prints a line per phase)."""
        import sys

        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True,
                    disable=not (self.progress and self.is_main and sys.stderr.isatty()))

    def say(self, message: str) -> None:
        """One line of what the run is doing (process 0, with ``progress``)."""
        if self.progress and self.is_main:
            print(f"[digirl_lite] {message}", flush=True)

    def log(self, **record: Any) -> None:
        if not self.is_main:
            return
        record = redact({"time": round(time.time(), 3), **record})  # no credentials
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record, default=float) + "\n")
        if self._tb is not None:
            prefix = str(record.get("stage", "run")).replace(":", "/")  # eval:online
            for k, v in record.items():
                if k != "time" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{prefix}/{k}", v, self.online_trajectories)
            self._tb.flush()
        if self.progress:
            keys = [k for k in record if k not in ("time",)]
            print("  ".join(f"{k}={record[k]}" for k in keys), flush=True)

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, its seconds added to ``timings[name]`` (an iteration's ``time_split``;
        part of the learners' interface, :class:`digirl_lite.learners.base.Run`)."""
        t0 = time.perf_counter()
        out = fn()
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
        return out

    def _totals(self, t0: float) -> dict[str, Any]:
        """The summary's totals at the end of a run (``t0``: when this attempt started)."""
        return {
            "wall_s": round(time.perf_counter() - t0, 1) + self.summary.get("wall_s", 0.0),
            "online_trajectories": self.online_trajectories,
            "processes": self.world_size,
            # the libraries and CPU kernels its numbers depend on (digirl_lite.provenance)
            "environment": environment(),
            "buffer": self.buffer.counts(),
            "timings_s": {k: round(v, 2) for k, v in self.timings.items()},
            "feature_cache_hit_rate": round(self.features.hit_rate, 3),
            # what the devices survived, and which left the fleet when (issue 29)
            "fleet": self._fleet_stats(),
            # per stage: unjudged steps / steps collected (the judge's reliability)
            "unjudged_step_rate": {k: round(u / n, 4) if n else 0.0
                                   for k, (u, n) in self.summary.get("unjudged_steps",
                                                                     {}).items()},
        }

    def _write_summary(self) -> None:
        """``summary.json`` (credentials redacted) and the learning curve (process 0)."""
        atomic_write_text(self.out / "summary.json", json.dumps(redact(self.summary),
                                                                 indent=1, default=float))
        self.plot()

    def plot(self) -> Path | None:
        """The learning curve to ``out/learning_curve.png``: drawn on a figure of its own
        (``matplotlib.figure.Figure``), so matplotlib's backend (a notebook's inline one)
        is left as it was."""
        try:
            from matplotlib.figure import Figure
        except ImportError:  # pragma: no cover - a core dependency
            return None
        xs = [x for x, _ in self.curve]
        ys = [y for _, y in self.curve]
        fig = Figure(figsize=(6, 4))
        ax = fig.subplots()
        ax.plot(xs, ys, marker="o")
        ax.set_xlabel("online trajectories")
        ax.set_ylabel(f"held-out success ({self.cfg.eval_tasks} test tasks)")
        ax.set_ylim(0, 1)
        where = f"simulated {self.cfg.world}" if self.cfg.env == "sim" else \
            f"{self.cfg.world} on {self.phones.n} devices"
        ax.set_title(f"{self.cfg.algorithm} {where}, seed {self.cfg.seed}")
        ax.grid(alpha=0.3)
        path = self.out / "learning_curve.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        return path
