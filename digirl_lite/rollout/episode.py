"""Run one episode of an agent in an environment and record it as a :class:`Trajectory`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from PIL import Image

from digirl_lite.data.records import (
    Ending,
    ScreenTable,
    Source,
    Step,
    Trajectory,
    Verdict,
    screen_id_of_image,
)
from digirl_lite.envs.base import TRUNCATION_INFRA, Env, Observation

__all__ = ["Agent", "run_episode", "RECORD_SIZE"]

RECORD_SIZE = (270, 570)
"""Screenshots are recorded shrunk 4x per side (the judge's view, spec section 4): enough
for image features, 16x less memory and disk than 1080 x 2280."""


class Agent(Protocol):
    def act(self, obs: Observation) -> str: ...


def _record_screen(screens: ScreenTable, obs: Observation, size: tuple[int, int] | None) -> str:
    sid = obs.screen_id or screen_id_of_image(obs.screenshot)
    if sid not in screens:
        img = obs.screenshot
        if size is not None and img.size != size:
            img = img.resize(size, Image.BILINEAR)
        screens.add(img, screen_id=sid)
    return sid


def run_episode(
    env: Env,
    agent: Agent,
    screens: ScreenTable,
    *,
    traj_id: str,
    task: Any = None,
    seed: int | None = None,
    source: Source = Source.ONLINE,
    iteration: int = -1,
    record_size: tuple[int, int] | None = RECORD_SIZE,
    seeds: dict[str, int] | None = None,
    on_step: Callable[[dict], None] | None = None,
) -> Trajectory:
    """Play one episode; every screen it shows goes into ``screens`` (once).

    The agent's exceptions propagate (a bug in the agent is not the environment's fault);
    the environment's own faults arrive as truncations and end up as INFRA trajectories.
    ``on_step`` receives each step's ``info`` (for logs and statistics).
    """
    obs, info = env.reset(task=task, seed=seed)
    task_text = obs.task
    steps: list[Step] = []
    ending, reason = None, None
    while True:
        t0 = time.perf_counter()
        text = agent.act(obs)
        policy_s = time.perf_counter() - t0
        sid = _record_screen(screens, obs, record_size)
        nobs, reward, terminated, truncated, info = env.step(text)
        if on_step is not None:
            on_step(info)
        nsid = _record_screen(screens, nobs, record_size)
        verdict = info.get("verdict")
        timings = {"policy_s": policy_s, **info.get("timings", {})}
        steps.append(Step(
            task=task_text, prompt=obs.prompt, action_text=text, action=info["action"],
            reward=float(reward), done=bool(terminated or truncated), screen_id=sid,
            next_screen_id=nsid, timings=timings,
            verdict=Verdict(verdict) if verdict is not None else None,
            judge_reply=info.get("judge_reply"),
        ))
        obs = nobs
        if terminated:
            ending = Ending.SUCCESS if reward > 0 else Ending.AGENT_STOP
            break
        if truncated:
            if info.get("truncation") == TRUNCATION_INFRA:
                ending, reason = Ending.INFRA, info.get("reason") or "infrastructure fault"
            else:
                ending = Ending.BUDGET
            break
    final = 1.0 if ending is Ending.SUCCESS else 0.0
    return Trajectory(
        traj_id=traj_id, task=task_text, steps=tuple(steps), final_reward=final, ending=ending,
        source=source, iteration=iteration, horizon=env.horizon,
        seeds=seeds or ({"env": seed} if seed is not None else {}), truncation_reason=reason,
    ).with_mc_returns()
