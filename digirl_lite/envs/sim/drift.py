"""Drift and the catalogue: how the phone's screens change from day to day, and what a
shop's search answers.

Each part of the phone (the launcher, Google, a shop, an app) is redesigned on its own day
(:func:`drift_day`): its main elements move down (:func:`drift_offset`) and are recoloured;
the launcher's icons swap places (:func:`launcher_order`). :func:`results_for` is a search's
answer, the same for the same site and query. All deterministic (fixed hashes).
"""

from __future__ import annotations

import hashlib

import numpy as np

from digirl_lite.envs.sim.catalog import APPS
from digirl_lite.envs.sim.tasks import N_RESULTS

__all__ = ["DRIFT_FIRST_DAY", "DRIFT_LAST_DAY", "drift_day", "drift_offset", "launcher_order",
           "results_for"]


def _h(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


DRIFT_FIRST_DAY, DRIFT_LAST_DAY = 2, 14


def drift_day(where: str) -> int:
    """The day ``where`` (the launcher, Google, a shop, an app) is first redesigned.

    Spread over days 2..14 by a fixed hash, so a policy frozen on day 1 loses one part of
    the phone after another, not everything at once (the paper's slow decay, Figure 3).
    """
    return DRIFT_FIRST_DAY + _h("drift-day", where) % (DRIFT_LAST_DAY - DRIFT_FIRST_DAY + 1)


def drift_offset(day: int, where: str) -> int:
    """How far (px, downwards) ``where``'s main elements moved by ``day`` (0 before its
    redesign day; 80..200 px after, changing every few days)."""
    start = drift_day(where)
    if day < start:
        return 0
    return 80 + 40 * ((_h("drift", where) + (day - start) // 3) % 4)


def _tint(color: tuple[int, int, int], day: int, where: str) -> tuple[int, int, int]:
    if day < drift_day(where):
        return color
    k = 1 + _h("tint", where) % 2
    return tuple(color[(i + k) % 3] for i in range(3))  # type: ignore[return-value]


def launcher_order(day: int) -> list[str]:
    """Icon order: after the launcher's redesign day, two pairs of icons swap places."""
    apps = list(APPS)
    if day < drift_day("launcher"):
        return apps
    n = len(apps)
    for k in range(2):
        i, j = _h("swap", k, "i") % n, _h("swap", k, "j") % n
        apps[i], apps[j] = apps[j], apps[i]
    return apps


_SUFFIXES = ("", " - Renewed", " Case", " Bundle", " 2-Pack", " Charger", " (Open Box)",
             " Accessory Kit", " Replacement", " Pro", " Stand", " Cable")


def results_for(site: str | None, query: str) -> list[tuple[str, str]]:
    """The catalogue answer to ``query``: N_RESULTS (title, price) pairs, deterministic.

    Index 0 is the product itself; the rest are related items.
    """
    q = " ".join(query.split())
    title = q[:1].upper() + q[1:] if q else "Item"
    rng = np.random.default_rng(_h("results", site, q.lower()) % 2**32)
    picks = [0] + list(rng.choice(np.arange(1, len(_SUFFIXES)), N_RESULTS - 1, replace=False))
    out = []
    for i in picks:
        price = 9.99 + float(rng.integers(1, 600))
        out.append((f"{title}{_SUFFIXES[int(i)]}", f"${price:,.2f}"))
    return out
