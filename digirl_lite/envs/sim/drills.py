"""The copy drills: goals that ask for made-up products (and, in General, searches with
made-up names), the pre-training a real Auto-UI brings in a few minutes, and the pairs the
span extractor is fine-tuned on. They are the simulator's task lists with their products or
names varied, so they live beside the simulator; the starting policy's fine-tuning
(:func:`digirl_lite.train.starting.train_sft`) and the span extractor take them from here.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from itertools import islice

import numpy as np

from digirl_lite.envs.sim.phrasings import (
    GENERAL_TRAIN_PHRASING_SETS,
    TRAIN_PHRASING_SETS,
    rephrase,
    rephrase_general,
    rephrase_train_tasks,
)
from digirl_lite.envs.sim.tasks import UnsupportedTaskError, load_task_file, parse_task
from digirl_lite.paths import data_dir
from digirl_lite.prompts import build_prompt, task_from_prompt

__all__ = ["copy_drills", "vary_products", "vary_queries", "extractor_pairs"]


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
    searches = [t for t in tasks if parse_task(t).kind == "search"]
    words = sorted({w.rstrip("?.,!") for t in searches for w in parse_task(t).query.split()})
    return searches, words, [w for w in words if w[:1].isupper()]


def _vary_query(text: str, rng: np.random.Generator, words: list[str], names: list[str],
                real_share: float = 0.65) -> str:
    """``text`` (a General search) with its names mostly replaced (each capitalised word
    after the first with probability 0.8, each other word of four letters or more with
    0.2), by a word of another query (probability ``real_share``) or a made-up one; the
    text unchanged if the result is no longer a search the simulator models."""
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
    expert's actions (:func:`digirl_lite.train.starting.train_sft`). Without them it learned
    a language model of product-like strings and mistyped every unseen product (0 of 64
    held-out searches). ``phrasing_share``: that share of the Web Shopping goals written with
    the train phrasings (``phrasings``: a name of :data:`~digirl_lite.envs.sim.phrasings.
    TRAIN_PHRASING_SETS`), so the product is copied from wherever people put it; General's
    searches with :data:`~digirl_lite.envs.sim.phrasings.GENERAL_TRAIN_PHRASING_SETS`."""
    if world == "general":
        searches, words, names = _searches(load_task_file(data_dir() / "tasks" /
                                                          "general_train.txt"))
        rng = np.random.default_rng(seed)
        # a set without a General entry ("wide", the span extractor's) leaves General as is
        general = GENERAL_TRAIN_PHRASING_SETS.get(phrasings) if phrasing_share else None
        prng = random.Random(seed)
        while True:
            text = _vary_query(searches[int(rng.integers(len(searches)))], rng, words, names,
                               real_share)
            if general is not None and prng.random() < phrasing_share:
                try:
                    text = rephrase_general(text, general, prng)
                except ValueError:  # a varied query no template writes: kept as it is
                    pass
            yield build_prompt(text), parse_task(text).query
    tasks = [t for t in load_task_file(data_dir() / "tasks" / "webshop_train.txt")
             if _QUOTED.search(t)]
    rng = np.random.default_rng(seed)
    product = _product_maker(tasks, rng, real_share)
    if phrasing_share:
        prng, templates = random.Random(seed), TRAIN_PHRASING_SETS[phrasings]
    while True:
        p = product()
        task = _QUOTED.sub(lambda m, p=p: f"{m[1]}{p}{m[1]}",
                           tasks[int(rng.integers(len(tasks)))], count=1)
        if phrasing_share and prng.random() < phrasing_share:
            task = rephrase(task, templates, prng)
        yield build_prompt(task), p


def extractor_pairs(world: str, share: float, phrasings: str, seed: int, drills: int
                    ) -> list[tuple[str, str]]:
    """What the span extractor (:class:`~digirl_lite.policy.span_extractor.SpanExtractor`)
    is trained on: ``world``'s train tasks (``share`` of them written with the train
    ``phrasings``, as the starting policy reads them) and ``drills`` copy drills
    (:func:`copy_drills`: made-up products), each with the text its expert types after the
    address: the product (a General search: its query)."""
    lines = load_task_file(data_dir() / "tasks" / f"{world}_train.txt")
    if share:
        lines = rephrase_train_tasks(lines, share, seed, phrasings)
    pairs = []
    for line in lines:
        text = line if isinstance(line, str) else line.text
        try:
            q = parse_task(text).query
        except (UnsupportedTaskError, ValueError):
            continue
        if q:
            pairs.append((text, q))
    if drills:
        drill = copy_drills(seed=seed, world=world, phrasing_share=share, phrasings=phrasings)
        pairs += [(task_from_prompt(p), q) for p, q in islice(drill, drills)]
    return pairs
