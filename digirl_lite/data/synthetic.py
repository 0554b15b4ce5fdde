"""Seeded random trajectories with small screens, for tests, benchmarks and the quickstart.

They exercise every record field (valid and malformed action strings, successes, agent
stops, budget runs, infrastructure truncations, unjudged steps) without a simulator; they
are noise, not demonstrations.
"""

from __future__ import annotations

import numpy as np

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.data.records import Ending, ScreenTable, Source, Step, Trajectory, Verdict
from digirl_lite.prompts import build_prompt

__all__ = ["random_pile"]

_TASKS = (
    'Go to costco.com, search for "bose soundsport free", and select the first entry',
    "Go to ebay.com, search for 'apple airpods'",
    "Go to walmart.com",
    "What's the news in India?",
)
_JUNK = ("Action Decision: \"action_type\": \"DUAL_POINT\", \"touch_point\": \"[0.5",
         "I think I should tap the button", "Action Decision: \"action_type\": \"SCROLL\"")


def _random_action(rng: np.random.Generator) -> str:
    kind = rng.choice(["tap", "swipe", "type", "key"], p=[0.5, 0.2, 0.15, 0.15])
    y, x = (float(v) for v in np.round(rng.random(2), 4))
    if kind == "tap":
        a = Action.tap(x=x, y=y)
    elif kind == "swipe":
        a = Action.swipe(x0=x, y0=0.8, x1=x, y1=0.3)
    elif kind == "type":
        a = Action.type_text(str(rng.choice(["bose soundsport free", "apple airpods", "news"])))
    else:
        keys = (ActionType.PRESS_BACK, ActionType.PRESS_HOME, ActionType.PRESS_ENTER)
        a = Action.key(keys[int(rng.integers(0, len(keys)))])
    return format_action(a)


def random_pile(
    n: int,
    seed: int = 0,
    horizon: int = 10,
    feature_dim: int = 16,
    n_screens: int = 24,
    image_size: tuple[int, int] = (27, 57),
    success_rate: float = 0.3,
    infra_rate: float = 0.05,
    invalid_rate: float = 0.05,
    unjudged_rate: float = 0.02,
    source: Source = Source.OFFLINE,
    iteration: int = -1,
) -> tuple[list[Trajectory], ScreenTable]:
    """``n`` random trajectories over a pool of ``n_screens`` distinct small screens.

    Deterministic in ``seed``. Features are random unit vectors of ``feature_dim`` floats.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    screens = ScreenTable(feature_dim)
    pool: list[str] = []
    w, h = image_size
    for _ in range(n_screens):
        arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        f = rng.standard_normal(feature_dim).astype(np.float32)
        pool.append(screens.add(Image.fromarray(arr), f / np.linalg.norm(f)))
    out: list[Trajectory] = []
    for i in range(n):
        task = str(rng.choice(_TASKS))
        length = int(rng.integers(1, horizon + 1))
        u = rng.random()
        if u < infra_rate:
            ending = Ending.INFRA
        elif u < infra_rate + success_rate:
            ending = Ending.SUCCESS
        elif length == horizon:
            ending = Ending.BUDGET
        else:
            ending = Ending.AGENT_STOP
        steps: list[Step] = []
        cur = pool[0]  # every episode starts on the same home screen
        last_text = None
        for t in range(length):
            last = t == length - 1
            if last and ending is Ending.AGENT_STOP:
                text = format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))
            elif rng.random() < invalid_rate:
                text = str(rng.choice(_JUNK))
            else:
                text = _random_action(rng)
            nxt = pool[int(rng.integers(0, n_screens))]
            reward = 1.0 if (last and ending is Ending.SUCCESS) else 0.0
            verdict = Verdict.SUCCESS if reward > 0 else Verdict.FAILURE
            if ending is not Ending.SUCCESS and rng.random() < unjudged_rate:
                verdict = Verdict.UNJUDGED
            steps.append(Step.from_text(
                task=task, prompt=build_prompt(task, last_text), action_text=text,
                reward=reward, done=last and ending is not Ending.INFRA, screen_id=cur,
                next_screen_id=nxt,
                timings={"policy_s": float(rng.random() * 0.1), "env_s": 0.01},
                verdict=verdict,
            ))
            cur, last_text = nxt, text
        out.append(Trajectory(
            traj_id=f"syn{seed}-{i:05d}", task=task, steps=tuple(steps),
            final_reward=1.0 if ending is Ending.SUCCESS else 0.0, ending=ending,
            source=source, iteration=iteration, horizon=horizon,
            seeds={"pile": seed, "index": i},
            truncation_reason="synthetic device crash" if ending is Ending.INFRA else None,
        ).with_mc_returns())
    return out, screens
