"""The stored pile and the demonstrations, regenerated deterministically from a seed.

* Demonstrations: the scripted expert on *clean* screens (no surprises), the data the
  starting policy copies (the AutoUI role: a copier of people, who rarely met pop-ups in
  their recordings).
* The pile: attempts of the :class:`Copier` (until the trainer's SFT policy replaces it) on
  the world with its surprises, scored by the oracle judge. Sizes as in the paper:
  Web Shopping 528 trajectories at H = 20, General 608 at H = 10 (spec section 7).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from digirl_lite.data.records import ScreenTable, Source, Trajectory
from digirl_lite.envs.sim.agents import DEFAULT_SLIP_RATE, Copier, ScriptedExpert, SlippingExpert
from digirl_lite.envs.sim.env import SimPhoneEnv
from digirl_lite.envs.sim.world import Surprises
from digirl_lite.rollout.episode import run_episode

__all__ = ["PILE_SIZES", "PileStats", "copy_drills", "generate_pile", "generate_demos",
           "vary_products", "vary_queries"]

PILE_SIZES = {"webshop": 528, "general": 608}
"""Off-to-on pile sizes of the paper (spec section 7)."""


@dataclass
class PileStats:
    """What a generated set holds (for logs and the issue notes)."""

    trajectories: int = 0
    steps: int = 0
    distinct_screens: int = 0
    success_rate: float = 0.0
    endings: dict[str, int] = field(default_factory=dict)
    surprises_seen: dict[str, int] = field(default_factory=dict)
    failures_after_surprise: int = 0
    failures_after_slip_only: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _episode_seed(seed: int, i: int) -> int:
    return (seed * 1_000_003 + i) % 2**31


_QUOTED = re.compile(r"""(["'])(?P<product>[^"']+)\1""")


def _product_maker(tasks: list[str], rng: np.random.Generator, real_share: float = 0.65):
    """A function that makes up a product: two to four words, each a word of some product in
    ``tasks`` (probability ``real_share``) or a made-up brand or model number."""
    words = sorted({w for t in tasks for m in _QUOTED.finditer(t) for w in m["product"].split()})

    def product() -> str:
        k = int(rng.integers(2, 5))
        return " ".join(str(rng.choice(words)) if words and rng.random() < real_share
                        else _made_up(rng) for _ in range(k))

    return product


_LETTERS = list("abcdefghijklmnopqrstuvwxyz")


def _made_up(rng: np.random.Generator) -> str:
    """A made-up brand ("zelvora") or model number ("kx-780", "q53")."""
    kind = rng.integers(0, 3)
    if kind == 0:  # a brand-like word
        return "".join(rng.choice(_LETTERS, size=int(rng.integers(4, 9))))
    if kind == 1:  # a model number like "kx-780"
        head = "".join(rng.choice(_LETTERS, size=int(rng.integers(1, 4))))
        return f"{head}-{int(rng.integers(1, 10_000))}"
    return f"{''.join(rng.choice(_LETTERS, size=int(rng.integers(1, 3))))}" \
           f"{int(rng.integers(1, 1000))}"


def _searches(tasks: list[str]) -> tuple[list[str], list[str], list[str]]:
    """General: the Google searches among ``tasks``, their queries' words, and the
    capitalised ones (names: places, shops, landmarks)."""
    from digirl_lite.envs.sim.tasks import parse_task

    searches = [t for t in tasks if parse_task(t).kind == "search"]
    words = sorted({w.rstrip("?.,!") for t in searches for w in parse_task(t).query.split()})
    return searches, words, [w for w in words if w[:1].isupper()]


def _vary_query(text: str, rng: np.random.Generator, words: list[str], names: list[str],
                real_share: float = 0.65) -> str:
    """``text`` (a General search) with its names mostly replaced (each capitalised word
    after the first with probability 0.8, each other word of four letters or more with
    0.2), by a word of another query (probability ``real_share``) or a made-up one; the
    text unchanged if the result is no longer a search the simulator models."""
    from digirl_lite.envs.sim.tasks import UnsupportedTaskError, parse_task

    out = text.split()
    for i, w in enumerate(out[1:], 1):
        core = w.rstrip("?.,!")
        name = core[:1].isupper()
        if rng.random() < (0.8 if name else 0.2 if len(core) >= 4 else 0.0):
            pool = names if name else words
            new = str(rng.choice(pool)) if pool and rng.random() < real_share \
                else _made_up(rng)
            out[i] = (new[:1].upper() + new[1:] if name else new) + w[len(core):]
    varied = " ".join(out)
    try:
        return varied if parse_task(varied).kind == "search" else text
    except (UnsupportedTaskError, ValueError):
        return text


def vary_queries(tasks: list[str], n: int, seed: int = 0) -> list[str]:
    """General's :func:`vary_products`: ``n`` tasks drawn from ``tasks``, each Google search
    with its names replaced (:func:`_vary_query`: "What is the capital of Spain?" ->
    "What is the capital of Zelvora?"). Every held-out General search names a place, shop
    or landmark that no train task names; on the train list alone the policy typed the
    train names it knew for them (8% held-out success)."""
    rng = np.random.default_rng(seed)
    searches, words, names = _searches(tasks)
    searches_set = set(searches)
    out = []
    for i in rng.integers(0, len(tasks), size=n):
        t = tasks[int(i)]
        out.append(_vary_query(t, rng, words, names) if t in searches_set else t)
    return out


def vary_products(tasks: list[str], n: int, seed: int = 0) -> list[str]:
    """``n`` tasks drawn from ``tasks`` with every quoted product replaced by a new one:
    two to four words, each a word of some product in ``tasks`` or a made-up brand or model
    number ("kx-780", "zelvora"). Demonstrations on these teach a policy to *copy* the
    product from its goal; on the train list's few hundred products it memorises them and
    types a train product for an unseen one."""
    rng = np.random.default_rng(seed)
    product = _product_maker(tasks, rng)
    out = []
    for i in rng.integers(0, len(tasks), size=n):
        out.append(_QUOTED.sub(lambda m: f"{m[1]}{product()}{m[1]}", tasks[int(i)], count=1))
    return out


def copy_drills(seed: int = 0, real_share: float = 0.35,
                world: str = "webshop", phrasing_share: float = 0.0,
                phrasings: str = "base") -> Iterator[tuple[str, str]]:
    """Endless ``(prompt, product)`` pairs: a policy prompt whose goal asks to search for a
    made-up product (a Web Shopping train task with its product replaced), and the product.
    ``world="general"``: a General train search with its names replaced
    (:func:`_vary_query`), and its query (what the expert types).

    The pre-training a real Auto-UI brings (FLAN-T5 copies spans from its input readily) in
    a few minutes: the tiny from-scratch T5 learns to *copy* from these before it learns the
    expert's actions (:meth:`digirl_lite.train.Trainer.train_sft`). Without them it learned
    a language model of product-like strings and mistyped every unseen product (0 of 64
    held-out searches). ``phrasing_share``: that share of the Web Shopping goals written with
    the train phrasings (``phrasings``: a name of :data:`~digirl_lite.envs.sim.phrasings.
    TRAIN_PHRASING_SETS`), so the product is copied from wherever people put it."""
    from digirl_lite.envs.sim.tasks import load_task_file
    from digirl_lite.paths import data_dir
    from digirl_lite.prompts import build_prompt

    if world == "general":
        from digirl_lite.envs.sim.tasks import parse_task

        searches, words, names = _searches(load_task_file(data_dir() / "tasks" /
                                                          "general_train.txt"))
        rng = np.random.default_rng(seed)
        while True:
            text = _vary_query(searches[int(rng.integers(len(searches)))], rng, words, names,
                               real_share)
            yield build_prompt(text), parse_task(text).query
    tasks = [t for t in load_task_file(data_dir() / "tasks" / "webshop_train.txt")
             if _QUOTED.search(t)]
    rng = np.random.default_rng(seed)
    product = _product_maker(tasks, rng, real_share)
    if phrasing_share:
        import random

        from digirl_lite.envs.sim.phrasings import TRAIN_PHRASING_SETS, rephrase

        prng, templates = random.Random(seed), TRAIN_PHRASING_SETS[phrasings]
    while True:
        p = product()
        task = _QUOTED.sub(lambda m, p=p: f"{m[1]}{p}{m[1]}",
                           tasks[int(rng.integers(len(tasks)))], count=1)
        if phrasing_share and prng.random() < phrasing_share:
            task = rephrase(task, templates, prng)
        yield build_prompt(task), p


def _run(
    kind: str, world: str, n: int, seed: int, make_agent, surprises: Surprises | None,
    day: int, source: Source, tasks: list[str] | None = None, layout: str = "older",
) -> tuple[list[Trajectory], ScreenTable, PileStats]:
    env = SimPhoneEnv(tasks or world, seed=seed, day=day, surprises=surprises, layout=layout)
    rng = np.random.default_rng(seed)
    task_idx = rng.integers(0, len(env.tasks), size=n)
    screens = ScreenTable()
    trajs: list[Trajectory] = []
    stats = PileStats()
    seen: Counter[str] = Counter()
    for i, ti in enumerate(task_idx):
        agent = make_agent(i)
        events: list[str] = []
        es = _episode_seed(seed, i)
        t = run_episode(
            env, agent, screens, traj_id=f"{kind}-{world}-s{seed}-{i:05d}",
            task=env.tasks[int(ti)], seed=es, source=source,
            seeds={"pile": seed, "episode": es},
            on_step=lambda info, ev=events: ev.extend(info.get("surprises", [])),
        )
        trajs.append(t)
        seen.update(events)
        if not t.is_success:
            if any(e in ("popup", "voice") for e in events):
                stats.failures_after_surprise += 1
            elif getattr(agent, "slip_steps", None):
                stats.failures_after_slip_only += 1
    env.close()
    stats.trajectories = len(trajs)
    stats.steps = sum(len(t) for t in trajs)
    stats.distinct_screens = len(screens)
    stats.success_rate = float(np.mean([t.is_success for t in trajs])) if trajs else 0.0
    stats.endings = dict(Counter(t.ending.value for t in trajs))
    stats.surprises_seen = dict(seen)
    return trajs, screens, stats


def generate_pile(
    world: str = "webshop", n: int | None = None, seed: int = 0,
    slip_rate: float = DEFAULT_SLIP_RATE, day: int = 1, surprises: Surprises | None = None,
) -> tuple[list[Trajectory], ScreenTable, PileStats]:
    """The copier's attempts on ``world``'s train tasks (default surprises), oracle-scored."""
    n = PILE_SIZES[world] if n is None else n
    return _run("pile", world, n, seed,
                lambda i: Copier(slip_rate=slip_rate, seed=_episode_seed(seed + 7, i)),
                surprises, day, Source.OFFLINE)


def generate_demos(
    world: str = "webshop", n: int = 400, seed: int = 0, day: int = 1,
    surprise_rate: float = 0.0, varied_products: bool = False, slip_rate: float = 0.0,
    phrasing_share: float = 0.0, phrasings: str = "base", surprises: Surprises | None = None,
    layout: str = "older", popup_back_share: float = 0.0,
) -> tuple[list[Trajectory], ScreenTable, PileStats]:
    """The expert's demonstrations on ``world``'s train tasks: clean (no surprises) by
    default; ``surprise_rate`` scales the default surprise probabilities (0.1: a tenth of
    them), so a few demonstrations show how the expert closes a pop-up or voice input;
    ``varied_products`` replaces each task's product with a new one (:func:`vary_products`;
    General: each search's names, :func:`vary_queries`), as people searched for many more
    things than the train list names. ``slip_rate`` > 0: the demonstrator slips and
    recovers (:class:`~digirl_lite.envs.sim.agents.SlippingExpert`), so demonstrations hold
    detours, as people's do. ``phrasing_share``: that share of the Web Shopping tasks
    written with the train phrasings (:func:`~digirl_lite.envs.sim.phrasings.
    rephrase_tasks`: "Search costco.com for ...", "look for ... at ebay.com and click the
    first result"; ``phrasings`` names the set), as people phrase requests many ways.
    ``surprises``: the rates ``surprise_rate`` scales (None: :class:`Surprises`' defaults);
    ``layout``: the phone's dialogs (:data:`~digirl_lite.envs.sim.world.LAYOUTS`).
    ``popup_back_share``: that share of pop-ups the demonstrator closes with BACK rather
    than their X (:class:`~digirl_lite.envs.sim.agents.SlippingExpert`)."""
    tasks = None
    if varied_products or phrasing_share:
        from digirl_lite.envs.sim.tasks import load_task_file
        from digirl_lite.paths import data_dir

        tasks = load_task_file(data_dir() / "tasks" / f"{world}_train.txt")
        if varied_products:
            tasks = (vary_queries if world == "general" else vary_products)(tasks, n, seed)
        if phrasing_share:
            from digirl_lite.envs.sim.phrasings import TRAIN_PHRASING_SETS, rephrase_tasks

            tasks = rephrase_tasks(tasks, phrasing_share, seed, TRAIN_PHRASING_SETS[phrasings])
    def demonstrator(i: int):
        if slip_rate or popup_back_share:
            return SlippingExpert(slip_rate, seed=_episode_seed(seed + 11, i),
                                  popup_back_share=popup_back_share)
        return ScriptedExpert()

    return _run("demo", world, n, seed, demonstrator,
                (surprises or Surprises()).scaled(surprise_rate), day, Source.OFFLINE, tasks,
                layout)
