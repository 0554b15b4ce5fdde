"""Record episodes as :class:`Trajectory` objects: one at a time, or many in lockstep."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
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
from digirl_lite.envs.lifecycle import PhaseFailed

__all__ = ["Agent", "EpisodeRecorder", "SampledAction", "run_episode", "record_screen",
           "RECORD_SIZE"]

RECORD_SIZE = (270, 570)
"""Screenshots are recorded shrunk 4x per side (the judge's view, spec section 4): enough
for image features, 16x less memory and disk than 1080 x 2280."""


class Agent(Protocol):
    def act(self, obs: Observation) -> str: ...


def record_screen(screens: ScreenTable, obs: Observation,
                  size: tuple[int, int] | None = RECORD_SIZE) -> str:
    """Put ``obs``'s screenshot into ``screens`` (once, shrunk to ``size``); return its id."""
    sid = obs.screen_id or screen_id_of_image(obs.screenshot)
    if sid not in screens:
        img = obs.screenshot
        if size is not None and img.size != size:
            img = img.resize(size, Image.BILINEAR)
        screens.add(img, screen_id=sid)
    return sid


class SampledAction(str):
    """An action string that carries how the policy sampled it: the token ids it wrote and
    their log-probabilities as drawn (:class:`~digirl_lite.policy.Sample`). It is a ``str``
    everywhere (environments, devices, worker processes and Ray actors see the text; it
    pickles with its attributes), and :class:`EpisodeRecorder` stores the extras on the step
    (``Step.action_token_ids``, ``Step.action_log_probs``)."""

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    decided_by: str
    """Who chose it under a harness (``Step.decided_by``); empty elsewhere."""

    def __new__(cls, text: str, token_ids: Sequence[int] = (),
                log_probs: Sequence[float] | None = (), decided_by: str = "") -> SampledAction:
        self = super().__new__(cls, text)
        self.token_ids = tuple(int(x) for x in token_ids)
        self.log_probs = tuple(float(x) for x in (log_probs or ()))
        self.decided_by = str(decided_by)
        return self

    def __reduce__(self):
        return (SampledAction, (str(self), self.token_ids, self.log_probs, self.decided_by))


class EpisodeRecorder:
    """Builds one trajectory from an environment's signals, step by step.

    The environment's faults arrive as truncations and end up as INFRA trajectories; the
    judge's UNJUDGED verdicts are kept on their steps (the trajectory is then not usable).
    The environment's own truth at the last step (``info["true_success"]``) becomes
    :attr:`Trajectory.true_success` (None for an infrastructure truncation: the episode did
    not end on the agent's account), and ``info["reached_first_milestone"]`` at the last
    step :attr:`reached_first_milestone` (None where the environment cannot tell); the
    simulator's ground truth of the ways back each step took (``info["recovered"]``) is
    gathered in :attr:`recoveries` and its ``info["failure_cause"]`` at the last step kept as
    :attr:`failure_cause` (None where the environment has none), for the reports.
    """

    def __init__(self, screens: ScreenTable, traj_id: str, obs: Observation, *,
                 source: Source = Source.ONLINE, iteration: int = -1, horizon: int = 20,
                 record_size: tuple[int, int] | None = RECORD_SIZE,
                 seeds: dict[str, int] | None = None) -> None:
        self.screens = screens
        self.traj_id = traj_id
        self.task = obs.task
        self.source, self.iteration, self.horizon = source, iteration, horizon
        self.record_size = record_size
        self.seeds = seeds or {}
        self.steps: list[Step] = []
        self.obs = obs
        self.sid = record_screen(screens, obs, record_size)
        self.trajectory: Trajectory | None = None
        self.states: list[Any] = [obs.state]  # ground truth where the env has it (sim)
        self.trees: list[Any] = [obs.ui_tree]  # what the agent saw (evidence reads these)
        self.reached_first_milestone: bool | None = None
        self.recoveries: list[str] | None = None  # None: the environment cannot tell
        self.failure_cause: str | None = None
        self._true_success: bool | None = None

    def record(self, action_text: str, nobs: Observation, reward: float, terminated: bool,
               truncated: bool, info: dict[str, Any], policy_s: float = 0.0,
               policy_version: int = -1) -> bool:
        """Add one step; return True when the episode is over (see :attr:`trajectory`).

        ``policy_version``: the version of the weights that wrote ``action_text``.
        """
        nsid = record_screen(self.screens, nobs, self.record_size)
        verdict = info.get("verdict")
        self.steps.append(Step(
            task=self.task, prompt=self.obs.prompt, action_text=str(action_text),
            action_token_ids=getattr(action_text, "token_ids", ()),
            action_log_probs=getattr(action_text, "log_probs", ()),
            action=info["action"], reward=float(reward), done=bool(terminated or truncated),
            screen_id=self.sid, next_screen_id=nsid,
            timings={"policy_s": policy_s, **info.get("timings", {})},
            verdict=Verdict(verdict) if verdict is not None else None,
            judge_reply=info.get("judge_reply"), policy_version=int(policy_version),
            decided_by=getattr(action_text, "decided_by", ""),
        ))
        self.obs, self.sid = nobs, nsid
        self.states.append(nobs.state)
        self.trees.append(nobs.ui_tree)
        if "recovered" in info:
            self.recoveries = [*(self.recoveries or ()), *info["recovered"]]
        if not (terminated or truncated):
            return False
        truth = info.get("true_success")
        self._true_success = None if truth is None else bool(truth)
        reached = info.get("reached_first_milestone")
        self.reached_first_milestone = None if reached is None else bool(reached)
        self.failure_cause = info.get("failure_cause")
        reason = None
        if terminated:
            ending = Ending.SUCCESS if reward > 0 else Ending.AGENT_STOP
        elif info.get("truncation") == TRUNCATION_INFRA:
            ending, reason = Ending.INFRA, info.get("reason") or "infrastructure fault"
        else:
            ending = Ending.BUDGET
        self._finish(ending, reason)
        return True

    def abort(self, reason: str) -> Trajectory:
        """End the episode as an infrastructure truncation (a worker died, a device hung)."""
        self._finish(Ending.INFRA, reason)
        return self.trajectory

    def _finish(self, ending: Ending, reason: str | None) -> None:
        self.trajectory = Trajectory(
            traj_id=self.traj_id, task=self.task, steps=tuple(self.steps),
            final_reward=1.0 if ending is Ending.SUCCESS else 0.0, ending=ending,
            source=self.source, iteration=self.iteration, horizon=self.horizon,
            seeds=self.seeds, truncation_reason=reason,
            true_success=None if ending is Ending.INFRA else self._true_success,
        ).with_mc_returns()


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

    The agent's exceptions propagate (a bug in the agent is not the environment's fault).
    ``on_step`` receives each step's ``info`` (for logs and statistics). A task whose setup
    phase fails is an infrastructure truncation without steps, its ``truncation_reason``
    naming the phase (spec/DARWIN.md A.3); the fleets record it the same way.
    """
    try:
        obs, _ = env.reset(task=task, seed=seed)
    except PhaseFailed as e:
        return Trajectory(traj_id=traj_id, task=getattr(task, "text", None) or str(task),
                          steps=(), final_reward=0.0, ending=Ending.INFRA, source=source,
                          iteration=iteration,
                          seeds=seeds or ({"env": seed} if seed is not None else {}),
                          truncation_reason=str(e)[:500])
    rec = EpisodeRecorder(screens, traj_id, obs, source=source, iteration=iteration,
                          horizon=env.horizon, record_size=record_size,
                          seeds=seeds or ({"env": seed} if seed is not None else {}))
    while True:
        t0 = time.perf_counter()
        text = agent.act(obs)
        policy_s = time.perf_counter() - t0
        obs, reward, terminated, truncated, info = env.step(text)
        if on_step is not None:
            on_step(info)
        if rec.record(text, obs, reward, terminated, truncated, info, policy_s):
            return rec.trajectory
