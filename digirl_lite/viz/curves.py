"""Learning curves from runs' metrics files (matplotlib).

:func:`plot_learning_curves` draws held-out success against online trajectories, one line
per run with its Wilson 95% band, coloured by algorithm, and the mean of the runs that share
an algorithm (seeds) where they were evaluated at the same points.
:func:`plot_seed_bands` draws one line per arm of a grid: the mean over seeds with a 95%
t-interval band (:func:`mean_ci95`), from plain (x, y) curves (``benchmarks/grid.py``).
:func:`plot_training_metrics` draws what the online iterations logged (kept steps, losses).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from digirl_lite.viz.runs import Run

__all__ = ["plot_learning_curves", "plot_training_metrics", "plot_seed_bands", "curve_rows",
           "final_success", "mean_ci95"]

TRAINING_KEYS = ("collect_success", "success_with_recovery", "kept_trajectories",
                 "kept_steps", "step_critic_loss", "instr_critic_loss", "actor_loss")
"""What ``Trainer.online_iteration`` logs per iteration, plotted by default."""


# Student's t, 97.5% quantile, for 1..30 degrees of freedom (scipy.stats.t.ppf(0.975, df));
# beyond 30 the Cornish-Fisher expansion below is within 2e-6 of it
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004,
         2.262157, 2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905,
         2.109816, 2.100922, 2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899,
         2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)


def _t975(df: int) -> float:
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959963985
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def mean_ci95(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t-interval of the mean of ``values`` (one per seed),
    ``mean +- t(0.975, n-1) * sd / sqrt(n)`` with the sample sd (ddof 1). NaN values are
    left out; one value gives (v, nan, nan), none gives three NaNs. Not clipped to [0, 1]."""
    v = np.asarray([x for x in values if x == x], dtype=float)
    if len(v) == 0:
        return (float("nan"),) * 3
    m = float(v.mean())
    if len(v) == 1:
        return (m, float("nan"), float("nan"))
    half = _t975(len(v) - 1) * float(v.std(ddof=1)) / np.sqrt(len(v))
    return (m, m - half, m + half)


def _figure(**kwargs: Any) -> Figure:
    # a bare Figure, not pyplot: no backend, no global figure list (reports run headless;
    # notebooks display the returned figure once)
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def _group(run: Run) -> str:
    return str(run.config.get("algorithm", run.name))


def curve_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Every evaluation point of every run as a flat row (for a table or a DataFrame)."""
    rows = []
    for run in runs:
        for p in run.curve():
            rows.append({"run": run.name, "algorithm": run.config.get("algorithm"),
                         "seed": run.config.get("seed"), "stage": p.stage,
                         "online_trajectories": p.online_trajectories,
                         "success_rate": p.success_rate, "ci95_low": p.ci95[0],
                         "ci95_high": p.ci95[1]})
    return rows


def final_success(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per algorithm: how many runs, and the mean, lowest and highest held-out success of
    their last evaluation (the comparison DigiRL vs Filtered BC over seeds)."""
    last: dict[str, list[float]] = {}
    for run in runs:
        pts = run.curve()
        if pts:
            last.setdefault(_group(run), []).append(pts[-1].success_rate)
    return [{"algorithm": g, "runs": len(v), "final_success_mean": float(np.mean(v)),
             "final_success_min": float(np.min(v)), "final_success_max": float(np.max(v))}
            for g, v in last.items()]


def plot_learning_curves(runs: Sequence[Run], *, ax: Any = None, band: bool = True,
                         mean: bool = True, title: str | None = None) -> Figure:
    """Held-out success rate vs online trajectories for each run.

    Args:
        runs: the runs (:class:`~digirl_lite.viz.Run`).
        ax: draw into this matplotlib Axes (default: a new figure).
        band: shade each run's 95% interval.
        mean: for algorithms with several runs, draw their mean where all were evaluated
            at the same x values (a thick line).
        title: the axes title (default: the world and evaluation size of the first run).

    Returns:
        The matplotlib Figure.
    """
    if ax is None:
        fig = _figure(figsize=(6.5, 4))
        ax = fig.subplots()
    else:
        fig = ax.figure
    groups = list(dict.fromkeys(_group(r) for r in runs))
    colors = {g: f"C{i % 10}" for i, g in enumerate(groups)}
    by_group: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {g: [] for g in groups}
    for run in runs:
        pts = run.curve()
        if not pts:
            continue
        x = np.array([p.online_trajectories for p in pts], dtype=float)
        y = np.array([p.success_rate for p in pts])
        g = _group(run)
        several = sum(_group(r) == g for r in runs) > 1
        ax.plot(x, y, marker="o", ms=3, color=colors[g], alpha=0.45 if several else 1.0,
                lw=1 if several else 1.8, label=run.label)
        if band:
            lo = np.array([p.ci95[0] for p in pts])
            hi = np.array([p.ci95[1] for p in pts])
            ax.fill_between(x, lo, hi, color=colors[g], alpha=0.08 if several else 0.15, lw=0)
        by_group[g].append((x, y))
    if mean:
        for g, curves in by_group.items():
            if len(curves) > 1 and all(np.array_equal(c[0], curves[0][0]) for c in curves):
                ys = np.mean([c[1] for c in curves], axis=0)
                ax.plot(curves[0][0], ys, color=colors[g], lw=2.6,
                        label=f"{g} mean of {len(curves)}")
    xmax = max([p.online_trajectories for r in runs for p in r.curve()] + [1])
    ax.set_xlim(-0.03 * xmax, 1.03 * xmax)  # a run evaluated only before online (x = 0)
    ax.set_xlabel("online trajectories")
    ax.set_ylabel("held-out success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if title is None and runs:
        c = runs[0].config
        title = (f"simulated {c.get('world', '?')}, {c.get('eval_tasks', '?')} test tasks"
                 if c else runs[0].name)
    if title:
        ax.set_title(title)
    if any(r.curve() for r in runs):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_seed_bands(arms: Mapping[str, Sequence[tuple[Sequence[float], Sequence[float]]]],
                    *, ax: Any = None, seeds: bool = True, xlabel: str = "online trajectories",
                    ylabel: str = "held-out success rate", title: str | None = None) -> Figure:
    """One learning curve per arm: the mean over its seeds, with the 95% t-interval over
    seeds (:func:`mean_ci95`) as a band.

    Args:
        arms: arm name -> one (xs, ys) curve per seed. Seeds are averaged at the x values
            every one of them has (an unfinished seed's curve is shorter); an arm with one
            seed draws that seed's line without a band.
        ax: draw into this matplotlib Axes (default: a new figure).
        seeds: also draw each seed's curve, thin.
        xlabel, ylabel, title: the axes' labels and title.

    Returns:
        The matplotlib Figure.
    """
    if ax is None:
        fig = _figure(figsize=(6.5, 4))
        ax = fig.subplots()
    else:
        fig = ax.figure
    xmax = 1.0
    for i, (name, curves) in enumerate(arms.items()):
        curves = [(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
                  for x, y in curves if len(x)]
        if not curves:
            continue
        color = f"C{i % 10}"
        if seeds and len(curves) > 1:
            for x, y in curves:
                ax.plot(x, y, color=color, lw=0.7, alpha=0.35)
        xs = sorted(set.intersection(*(set(x.tolist()) for x, _ in curves)))
        at = [[float(y[x == v][-1]) for x, y in curves] for v in xs]
        stats = np.array([mean_ci95(col) for col in at]).reshape(-1, 3)
        ax.plot(xs, stats[:, 0], marker="o", ms=3, lw=2, color=color,
                label=f"{name} ({len(curves)} seed{'s' * (len(curves) > 1)})")
        if len(curves) > 1:
            ax.fill_between(xs, np.clip(stats[:, 1], 0, 1), np.clip(stats[:, 2], 0, 1),
                            color=color, alpha=0.18, lw=0)
        xmax = max([xmax, *xs])
    ax.set_xlim(-0.03 * xmax, 1.03 * xmax)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_training_metrics(runs: Sequence[Run], keys: Sequence[str] = TRAINING_KEYS, *,
                          ncols: int = 3) -> Figure:
    """One panel per logged key of the online iterations, one line per run.

    Keys no run logged are left out; with none at all the figure says so.
    """
    keys = [k for k in keys if any(r.series(k)[0] for r in runs)]
    n = max(1, len(keys))
    nrows = (n + ncols - 1) // ncols
    fig = _figure(figsize=(3.4 * min(ncols, n), 2.6 * nrows))
    axes = fig.subplots(nrows, min(ncols, n), squeeze=False)
    groups = list(dict.fromkeys(_group(r) for r in runs))
    for ax, key in zip(axes.flat, keys):
        for run in runs:
            x, y = run.series(key)
            if x:
                ax.plot(x, y, marker=".", color=f"C{groups.index(_group(run)) % 10}",
                        label=run.label, alpha=0.8)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("online trajectories", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    if not keys:
        axes.flat[0].text(0.5, 0.5, "no online iterations logged", ha="center", va="center")
    elif len(runs) > 1:
        axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    return fig
