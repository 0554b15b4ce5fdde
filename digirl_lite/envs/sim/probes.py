"""Checks that an image encoder sees what the policy needs on the simulated phone.

Shared by ``tests/policy/test_vision.py`` and ``benchmarks/bench_vision.py``:

* :func:`collect_sim_screens` plays scripted-expert and copier episodes and keeps every
  distinct screen (by pixels) with a label: the page kind plus the overlay;
* :func:`loo_nn_accuracy`: leave-one-out 1-nearest-neighbour accuracy of those labels from
  the features (can the features tell the screen kinds apart?);
* :func:`popup_probe`: how far a pop-up moves a page's features, against how far changing
  the query of the same page moves them;
* :func:`drift_probe`: how far the same page moves between two drift days.

They play the simulator's phones, so they live beside it: the encoders in
:mod:`digirl_lite.vision` know no world.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from digirl_lite.data.records import screen_id_of_image

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

    from digirl_lite.envs.sim.world import Page, PhoneState
    from digirl_lite.vision.cache import ImageEncoder

__all__ = [
    "LabeledScreen", "screen_label", "collect_sim_screens", "loo_nn_accuracy",
    "popup_probe", "drift_probe", "PROBE_QUERIES",
]

PROBE_QUERIES = ("usb c cable", "logitech wireless mouse", "samsung galaxy s10", "dell xps 13")
"""Queries of the popup probe's same-kind pairs (any product strings do)."""


@dataclass(frozen=True)
class LabeledScreen:
    image: Image.Image
    label: str
    screen_id: str
    """Content hash of ``image`` (distinct screens have distinct ids)."""
    state: Any = None


def screen_label(state: PhoneState) -> str:
    """What a screen shows, as a class: ``kind`` or ``kind+overlay``, ``voice``, ``blank``.

    Voice input covers the whole page below the status bar, so every ``voice`` screen has the
    same pixels whatever page is under it; a loading page is plain white. Neither can carry
    the page's kind.
    """
    if state.loading:
        return "blank"
    if state.overlay == "voice":
        return "voice"
    kind = state.page.kind
    return f"{kind}+{state.overlay}" if state.overlay else kind


def collect_sim_screens(
    task_sets: Sequence[str] = ("webshop_test", "general_test"),
    episodes: int = 100,
    size: tuple[int, int] | None = (270, 570),
    seed: int = 0,
) -> list[LabeledScreen]:
    """Distinct screens of ``episodes`` episodes per task set, half expert, half copier.

    Default surprises; episode ``i`` is seeded ``seed * 100_000 + i``. Screens are resized
    to ``size`` (the recorded size, ``rollout.episode.RECORD_SIZE``; None keeps 1080 x 2280)
    and deduplicated by pixels: the environment's ``screen_id`` names the layout, and several
    layouts (a voice overlay over different pages) draw the same pixels.
    """
    from PIL import Image

    from digirl_lite.envs.sim import Copier, ScriptedExpert, SimPhoneEnv

    out: dict[str, LabeledScreen] = {}
    seen_layouts: set[str] = set()

    def keep(obs) -> None:
        if obs.screen_id in seen_layouts:
            return
        seen_layouts.add(obs.screen_id)
        img = obs.screenshot
        if size is not None and img.size != tuple(size):
            img = img.resize(tuple(size), Image.BILINEAR)
        else:
            img = img.copy()
        sid = screen_id_of_image(img)
        if sid not in out:
            out[sid] = LabeledScreen(img, screen_label(obs.state), sid, obs.state)

    for tasks in task_sets:
        env = SimPhoneEnv(tasks, seed=seed)
        for i in range(episodes):
            agent = Copier(seed=seed * 100_000 + i) if i % 2 else ScriptedExpert()
            obs, _ = env.reset(seed=seed * 100_000 + i)
            keep(obs)
            done = False
            while not done:
                obs, _, terminated, truncated, _ = env.step(agent.act(obs))
                keep(obs)
                done = terminated or truncated
        env.close()
    return list(out.values())


def loo_nn_accuracy(
    features: np.ndarray, labels: Sequence[str], min_class_size: int = 2
) -> dict[str, Any]:
    """Leave-one-out 1-nearest-neighbour (Euclidean) accuracy of ``labels`` from ``features``.

    A screen whose label occurs fewer than ``min_class_size`` times cannot be right under
    leave-one-out, so it is not scored (it still serves as a neighbour for the others).

    Returns:
        ``accuracy`` (scored screens), ``accuracy_all`` (every screen), ``n_scored``,
        ``n_screens``, ``n_classes``, ``confusions``: [(true, predicted, count), ...].
    """
    x = np.asarray(features, dtype=np.float64)  # (N, d)
    y = np.asarray(list(labels))
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"need >= 2 screens with one label each, got {len(x)} and {len(y)}")
    sq = (x * x).sum(1)
    dist = sq[:, None] + sq[None, :] - 2.0 * x @ x.T  # (N, N) squared distances
    np.fill_diagonal(dist, np.inf)
    pred = y[dist.argmin(1)]
    counts = Counter(y.tolist())
    scored = np.array([counts[c] >= min_class_size for c in y])
    right = pred == y
    confusions = Counter((str(t), str(p)) for t, p, s in zip(y, pred, scored) if s and t != p)
    return {
        "accuracy": float(right[scored].mean()) if scored.any() else float("nan"),
        "accuracy_all": float(right.mean()),
        "n_scored": int(scored.sum()),
        "n_screens": len(y),
        "n_classes": len(counts),
        "confusions": [(t, p, n) for (t, p), n in confusions.most_common()],
    }


def _render(states: Sequence[PhoneState], size: tuple[int, int] | None) -> list[Image.Image]:
    from PIL import Image

    from digirl_lite.envs.sim.render import Renderer

    r = Renderer(cache_size=0)
    out = []
    for s in states:
        img = r.render(s)
        out.append(img.resize(tuple(size), Image.BILINEAR) if size is not None else img)
    return out


def _query_pages(query: str) -> list[Page]:
    """Every page kind that shows a query: results and product pages of each shop, Google's."""
    from digirl_lite.envs.sim.catalog import TRAIN_SITES
    from digirl_lite.envs.sim.world import N_RESULTS, Page

    order = tuple(range(N_RESULTS))
    pages = [Page("chrome", "google_results", query=query)]
    for site in TRAIN_SITES:
        pages.append(Page("chrome", "shop_results", site=site, query=query, order=order))
        pages.append(Page("chrome", "shop_product", site=site, query=query, item=0, order=order))
    return pages


def _summary(d: Sequence[float]) -> dict[str, float]:
    a = np.asarray(d, dtype=np.float64)
    return {"mean": round(float(a.mean()), 4), "min": round(float(a.min()), 4),
            "max": round(float(a.max()), 4), "n": int(a.size)}


def popup_probe(
    encoder: ImageEncoder, queries: Sequence[str] = PROBE_QUERIES,
    size: tuple[int, int] | None = (270, 570),
) -> dict[str, Any]:
    """Feature distances: a page vs the same page under an overlay, vs another query.

    For every page that shows a query (Google results, each shop's results and product
    page) and every pair of ``queries``: ``same_kind`` is the distance between the page for
    query A and the page for query B; ``popup`` (``consent``, ``voice``) the distance between
    the page for A and the same page with a pop-up (consent banner, voice input) on it.
    ``popup_over_same_kind`` = min popup distance / max same-kind distance (> 1: every
    pop-up moves the features more than any query change; None if no query change moves
    them).
    """
    from digirl_lite.envs.sim.world import PhoneState

    pages_a, pages_b = [], []
    for qa, qb in itertools.combinations(queries, 2):
        pages_a += _query_pages(qa)
        pages_b += _query_pages(qb)
    n = len(pages_a)
    states = [PhoneState(page=p) for p in pages_a] + [PhoneState(page=p) for p in pages_b]
    for overlay in ("popup", "consent", "voice"):
        states += [PhoneState(page=p, overlay=overlay) for p in pages_a]
    f = encoder.encode(_render(states, size))  # (5n, d)
    base, other = f[:n], f[n:2 * n]
    dist = {
        "same_kind": np.linalg.norm(base - other, axis=1),
        "popup": np.linalg.norm(base - f[2 * n:3 * n], axis=1),
        "consent": np.linalg.norm(base - f[3 * n:4 * n], axis=1),
        "voice": np.linalg.norm(base - f[4 * n:], axis=1),
    }
    out: dict[str, Any] = {k: _summary(v) for k, v in dist.items()}
    worst_same = float(dist["same_kind"].max())
    out["popup_over_same_kind"] = (  # None: the features do not see a query change at all
        round(float(dist["popup"].min()) / worst_same, 3) if worst_same > 0 else None)
    return out


def drift_probe(
    encoder: ImageEncoder, day_a: int = 1, day_b: int = 7,
    size: tuple[int, int] | None = (270, 570), query: str = PROBE_QUERIES[0],
) -> dict[str, Any]:
    """Feature distances between the same page on ``day_a`` and on ``day_b``.

    Pages: the launcher, Google's home and results, each shop's home, results and product
    page, each app's home. Drift reaches each part of the phone on its own day
    (``world.drift_day``), so some pages have not changed by ``day_b``: they are counted
    apart (``unchanged``, distance 0 up to float error).
    """
    from digirl_lite.envs.sim.catalog import APPS, TRAIN_SITES
    from digirl_lite.envs.sim.world import Page, PhoneState

    pages = [Page(), Page("chrome", "google_home")] + _query_pages(query)
    pages += [Page("chrome", "shop_home", site=s) for s in TRAIN_SITES]
    pages += [Page(a, "app_home") for a in APPS if a != "chrome"]
    states = [PhoneState(page=p, day=day_a) for p in pages]
    states += [PhoneState(page=p, day=day_b) for p in pages]
    imgs = _render(states, size)
    n = len(pages)
    changed = [imgs[i].tobytes() != imgs[n + i].tobytes() for i in range(n)]
    f = encoder.encode(imgs)
    d = np.linalg.norm(f[:n] - f[n:], axis=1)
    moved = [float(x) for x, c in zip(d, changed) if c]
    out: dict[str, Any] = {"days": [day_a, day_b], "pages": n, "changed": len(moved),
                           "unchanged_max": round(float(max(
                               [x for x, c in zip(d, changed) if not c], default=0.0)), 4)}
    if moved:
        out["changed_distance"] = _summary(moved)
    return out
