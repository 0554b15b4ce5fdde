"""Few-shot examples for the paper's judge, drawn from the simulated phone.

Labelled screenshots (success and failure, including the surprises a judge must not be
fooled by) with the three-line answers, written as a :class:`~digirl_lite.judge.FewShotSet`
folder. The paper used 11 Web Shopping and 9 General examples.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from digirl_lite.actions import to_gesture
from digirl_lite.envs.sim.agents import expert_action
from digirl_lite.envs.sim.render import Renderer
from digirl_lite.envs.sim.tasks import Task, load_tasks
from digirl_lite.envs.sim.world import (
    HEIGHT,
    WIDTH,
    PhoneState,
    describe,
    initial_state,
    is_success,
    transition,
)
from digirl_lite.judge.guards import shrink
from digirl_lite.judge.paper import expected_q
from digirl_lite.paths import data_dir

__all__ = ["EXAMPLE_COUNTS", "expert_states", "answer_for", "write_examples"]

EXAMPLE_COUNTS = {"webshop": 11, "general": 9}


def expert_states(task: Task, max_steps: int = 30) -> list[PhoneState]:
    """The clean states the expert passes through for ``task`` (start to success)."""
    s = initial_state()
    out = [s]
    for _ in range(max_steps):
        a = expert_action(s, task)
        if a.ends_episode:
            break
        s = transition(s, to_gesture(a, WIDTH, HEIGHT))
        out.append(s)
    return out


def answer_for(task: Task, state: PhoneState) -> str:
    """The three-line answer for ``state``: Q, A (expectation, then the screen), Status."""
    if task.kind == "webshop":
        site = f"{task.site}.com"
        expect = {1: f"the {site} website",
                  2: f"{site} search results for '{task.query}'",
                  3: f"the product page of the first entry of {site}'s results for "
                     f"'{task.query}'"}[task.level]
    elif task.kind == "search":
        expect = f"Google search results for '{task.query}'"
    else:
        expect = f"the {task.app} app open"
    ok = is_success(state, task)
    return (f"{expected_q(task.text)}\n"
            f"A: I should expect to see {expect}. The screenshot shows {describe(state)}.\n"
            f"Status: {'success' if ok else 'failure'}")


def write_examples(world: str, out_dir: str | Path, seed: int = 0,
                   n: int | None = None) -> Path:
    """Write ``n`` labelled examples (about half successes) for ``world`` to ``out_dir``."""
    n = EXAMPLE_COUNTS[world] if n is None else n
    rng = np.random.default_rng(seed)
    tasks = load_tasks(data_dir() / "tasks" / f"{world}_train.txt")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    renderer = Renderer(cache_size=0)
    rows = []
    for i in range(n):
        task = tasks[int(rng.integers(len(tasks)))]
        states = expert_states(task)
        kind = i % 3  # success / earlier clean screen / surprise over the success screen
        if kind == 0:
            state = states[-1]
        elif kind == 1:
            state = states[int(rng.integers(max(1, len(states) - 1)))]
        else:
            state = replace(states[-1], overlay=("popup", "voice")[int(rng.integers(2))])
        name = f"{world}_{i:02d}.png"
        shrink(renderer.render(state)).save(out / name)
        rows.append({"image": name, "task": task.text, "answer": answer_for(task, state)})
    (out / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                      encoding="utf-8")
    return out
