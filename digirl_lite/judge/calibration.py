"""Judge calibration against labels (people's, or the simulator's oracle).

:func:`calibrate` compares binary verdicts with labels and reports accuracy, precision,
recall, F1, the false-success rate (true failures called success: these teach a wrong
habit) and the false-failure rate (true successes called failure: these waste an attempt),
each with a 95% interval, and the confusion matrix. Unjudged predictions are counted and
left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["calibrate", "wilson_interval", "to_label"]

_TRUE = {"1", "true", "success", "yes", "y", "t", "pass"}
_FALSE = {"0", "false", "failure", "fail", "no", "n", "f"}


def to_label(x: Any) -> bool | None:
    """True / False from 1/0, bools, 'success'/'failure', Verdict; None for unjudged."""
    if x is None:
        return None
    v = getattr(x, "value", x)
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, float, np.integer, np.floating)):
        if v in (0, 1):
            return bool(v)
        raise ValueError(f"label {x!r} is not 0 or 1")
    s = str(v).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    if s in ("unjudged", "", "none", "nan"):
        return None
    raise ValueError(f"cannot read {x!r} as success/failure")


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials ((nan, nan) when n = 0)."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def _ratio(k: int, n: int) -> float:
    return k / n if n else math.nan


def _f1(tp: int, fp: int, fn: int) -> float:
    return 2 * tp / (2 * tp + fp + fn) if (2 * tp + fp + fn) else math.nan


def calibrate(predictions: Sequence[Any], labels: Sequence[Any], *, n_boot: int = 2000,
              seed: int = 0) -> dict[str, Any]:
    """Compare verdicts with labels (success = positive).

    Args:
        predictions: the judge's verdicts (bools, 0/1, 'success'/'failure', Verdict, or
            None / 'unjudged').
        labels: the truth, same forms (no unjudged).
        n_boot: bootstrap resamples for the F1 interval.

    Returns:
        ``accuracy``, ``precision``, ``recall``, ``f1``, ``false_success_rate``,
        ``false_failure_rate`` (floats), ``ci`` (95% intervals: Wilson for the rates,
        bootstrap for F1), ``confusion`` ({tp, fp, fn, tn}), ``n`` (judged) and
        ``unjudged``.
    """
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions but {len(labels)} labels")
    pairs = []
    unjudged = 0
    for p, y in zip(predictions, labels):
        yl = to_label(y)
        if yl is None:
            raise ValueError("labels must be success or failure, not unjudged")
        pl = to_label(p)
        if pl is None:
            unjudged += 1
            continue
        pairs.append((pl, yl))
    arr = np.array(pairs, dtype=bool).reshape(-1, 2)
    pred, truth = arr[:, 0], arr[:, 1]
    tp = int(np.sum(pred & truth))
    fp = int(np.sum(pred & ~truth))
    fn = int(np.sum(~pred & truth))
    tn = int(np.sum(~pred & ~truth))
    n = tp + fp + fn + tn
    out: dict[str, Any] = {
        "accuracy": _ratio(tp + tn, n),
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        "f1": _f1(tp, fp, fn),
        "false_success_rate": _ratio(fp, fp + tn),
        "false_failure_rate": _ratio(fn, fn + tp),
        "confusion": {"tp": tp, "fp": fp, "fn": fn, "tn": tn},
        "n": n,
        "unjudged": unjudged,
    }
    ci = {
        "accuracy": wilson_interval(tp + tn, n),
        "precision": wilson_interval(tp, tp + fp),
        "recall": wilson_interval(tp, tp + fn),
        "false_success_rate": wilson_interval(fp, fp + tn),
        "false_failure_rate": wilson_interval(fn, fn + tp),
    }
    if n:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, n, size=(n_boot, n))
        bp, bt = pred[idx], truth[idx]
        btp = np.sum(bp & bt, axis=1)
        bfp = np.sum(bp & ~bt, axis=1)
        bfn = np.sum(~bp & bt, axis=1)
        den = 2 * btp + bfp + bfn
        f1s = np.where(den > 0, 2 * btp / np.maximum(den, 1), np.nan)
        f1s = f1s[~np.isnan(f1s)]
        ci["f1"] = (tuple(float(x) for x in np.percentile(f1s, [2.5, 97.5]))
                    if f1s.size else (math.nan, math.nan))
    else:
        ci["f1"] = (math.nan, math.nan)
    out["ci"] = ci
    return out
