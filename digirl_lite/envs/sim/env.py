"""``SimPhoneEnv``: the built-in simulated phone behind the shared environment interface."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from digirl_lite.actions import Action, Gesture, format_action, parse_action, to_gesture
from digirl_lite.data.records import Verdict
from digirl_lite.envs.base import TRUNCATION_BUDGET, TRUNCATION_INFRA, Observation
from digirl_lite.envs.lifecycle import SETUP, TEARDOWN, PhaseFailed, hard_reset_due
from digirl_lite.envs.sim.render import Renderer, blank_screen, screen_key
from digirl_lite.envs.sim.tasks import Task, UnsupportedTaskError, load_tasks, parse_task
from digirl_lite.envs.sim.world import (
    HEIGHT,
    LAYOUTS,
    WIDTH,
    PhoneState,
    Surprises,
    apply_phase,
    failure_cause,
    initial_state,
    is_success,
    minimal_reset,
    phase_reached,
    reached_first_milestone,
    recoveries_between,
    surprises_between,
    transition,
    ui_nodes,
)
from digirl_lite.judge.base import Judge, JudgeResult
from digirl_lite.judge.oracle import OracleJudge
from digirl_lite.paths import data_dir
from digirl_lite.prompts import build_prompt

__all__ = ["Faults", "SimPhoneEnv", "SimEnvFactory", "TASK_SETS"]

TASK_SETS = ("webshop", "general")
MAX_PROMPT_ACTION_CHARS = 300
"""An invalid action's raw text goes into the next prompt cut to this length."""
BLANK_CAPTURE = "blank"
"""The screen id of a capture that came back all white (the blank-screenshot fault)."""


@dataclass(frozen=True)
class Faults:
    """Infrastructure faults, for testing fleets (all off by default).

    Attributes:
        crash: per-step probability that the device stops answering (the episode is
            truncated as ``"infrastructure"``).
        blank_screenshot: per-capture probability of an all-white screenshot; retried up
            to ``blank_retries`` times (the reference code's blank-screen guard), then the
            episode is truncated as ``"infrastructure"``.
        blank_retries: retries of a blank capture (5 in the reference code).
        latency_median_s: median of a log-normal per-step latency (0: none).
        latency_sigma: log-normal sigma of that latency.
        setup_failure: per-episode probability that a task's setup phase fails (the phone
            did not reach its start state, as an app that would not launch): the reset
            raises :class:`~digirl_lite.envs.lifecycle.PhaseFailed`.
        teardown_failure: per-episode probability that a task's teardown phase fails (the
            phone is left as the agent left it; the next reset is a hard one).
    """

    crash: float = 0.0
    blank_screenshot: float = 0.0
    blank_retries: int = 5
    latency_median_s: float = 0.0
    latency_sigma: float = 0.5
    setup_failure: float = 0.0
    teardown_failure: float = 0.0

    def __post_init__(self) -> None:
        for name in ("crash", "blank_screenshot", "setup_failure", "teardown_failure"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"Faults.{name} must be a probability, got {p}")
        if self.blank_retries < 0 or self.latency_median_s < 0 or self.latency_sigma < 0:
            raise ValueError("Faults: retries and latencies must be non-negative")


def _coerce(cls, value):
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        return cls(**value)
    raise TypeError(f"expected {cls.__name__} or a dict of its fields, got {type(value).__name__}")


class SimPhoneEnv:
    """The simulated phone (Web Shopping world at H = 20 by default).

    Args:
        tasks: ``"webshop"`` or ``"general"`` (the shipped train lists in ``assets/tasks``),
            ``"webshop_test"`` / ``"general_test"``, a path to a one-instruction-per-line
            file, or a sequence of instructions / :class:`Task` objects. ``reset()`` without
            a task draws one from these.
        horizon: step budget H; None uses the task's (20 Web Shopping, 10 General).
        day: drift day (1 = the layout demonstrations were recorded on).
        surprises: :class:`Surprises` or a dict of its fields.
        faults: :class:`Faults` or a dict of its fields.
        judge: the judge that gives rewards (default: :class:`OracleJudge`). Each
            environment needs its own judge object (judges keep per-device guards).
        seed: seeds task draws, surprises and faults; ``reset(seed=...)`` reseeds.
        width, height: screenshot size (1080 x 2280 as on the paper's emulators).
        render_cache: screens kept drawn (each full-size screen is ~7 MB). Eight keep 92% of
            the hits of 32 (an env draws most screens twice in a row) at a quarter of the
            memory, which matters in a fleet: 16 phones x 32 screens held 3.8 GB.
        skip_unsupported: drop the instructions of a task file that the simulator cannot
            model (e.g. the AitW General list's "Install ..." lines) instead of raising.
        hard_reset_every: between episodes the phone gets Darwin's minimal reset (the home
            screen, the sites seen kept: their cookie banners stay answered) and every
            ``hard_reset_every``-th episode a hard reset to the saved phone
            (spec/DARWIN.md A.2; 0: never). 1 (default): every episode starts from the
            saved phone, as the paper's emulators did (spec section 1) and every run of
            this project before the lifecycle.
        ui_tree: put the screen's UI tree in ``info["ui_tree"]`` at every reset and step
            (:class:`~digirl_lite.envs.uitree.UINode` list, as a device's page source reads).
        layout: the dialogs' design, one of :data:`~digirl_lite.envs.sim.world.LAYOUTS`
            ("older": the demonstrations'; "current": today's live phone, issue 47).
        privileged_state: put the simulator's state on every observation
            (``obs.state``: privileged, a real device has none; the scripted experts read
            it). False: ``obs.state`` is None, as on a real device; the environment's own
            judge and ground truth still read the state (issue 48: DarwinX's default path).
    """

    def __init__(
        self,
        tasks: str | Path | Sequence[str | Task] = "webshop",
        horizon: int | None = None,
        day: int = 1,
        surprises: Surprises | dict | None = None,
        faults: Faults | dict | None = None,
        judge: Judge | None = None,
        seed: int | None = 0,
        width: int = WIDTH,
        height: int = HEIGHT,
        render_cache: int = 8,
        skip_unsupported: bool = False,
        hard_reset_every: int = 1,
        ui_tree: bool = False,
        layout: str = "older",
        privileged_state: bool = True,
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        self.layout = layout
        self._submitted: list[str] = []  # the queries this task's episode searched for
        self._recovered: list[str] = []  # the last gesture's ways back (recoveries_between)
        if horizon is not None and horizon <= 0:
            raise ValueError(f"horizon must be positive, got {horizon}")
        if isinstance(hard_reset_every, bool) or not isinstance(hard_reset_every, int) \
                or hard_reset_every < 0:
            raise ValueError(f"hard_reset_every must be an int >= 0, got {hard_reset_every!r}")
        self.hard_reset_every = hard_reset_every
        self.ui_tree = ui_tree  # info["ui_tree"]: the screen's nodes (issue 30)
        self.privileged_state = bool(privileged_state)  # obs.state, or None (issue 48)
        self._since_hard = 0  # episodes since the last hard reset, this one included
        self.last_reset: str | None = None
        """``"hard"`` or ``"minimal"``: how the current episode's phone was reset."""
        self._hard_next = False
        self.tasks = self._load_task_list(tasks, skip_unsupported)
        self._fixed_horizon = horizon
        self.day = day
        self.surprises = _coerce(Surprises, surprises)
        self.faults = _coerce(Faults, faults)
        self.judge = judge if judge is not None else OracleJudge()
        self.renderer = Renderer(width, height, render_cache)
        self.rng = np.random.default_rng(seed)
        self.task: Task | None = None
        self.state: PhoneState | None = None
        self.horizon = horizon or 20
        self._steps = 0
        self._done = True
        self._obs: Observation | None = None
        self._closed = False

    # -- tasks --------------------------------------------------------------------------
    @staticmethod
    def _load_task_list(tasks, skip_unsupported: bool = False) -> list[Task]:
        if isinstance(tasks, (str, Path)):
            name = str(tasks)
            if name in TASK_SETS or name in tuple(f"{s}_test" for s in TASK_SETS):
                split = "test" if name.endswith("_test") else "train"
                path = data_dir() / "tasks" / f"{name.removesuffix('_test')}_{split}.txt"
            else:
                path = Path(name)
            if not path.is_file():
                raise FileNotFoundError(f"task list {path} does not exist")
            out = load_tasks(path, skip_unsupported=skip_unsupported)
        else:
            out = []
            for t in tasks:
                try:
                    out.append(t if isinstance(t, Task) else parse_task(t))
                except UnsupportedTaskError:
                    if not skip_unsupported:
                        raise
        if not out:
            raise ValueError("the task list is empty")
        return out

    # -- episode ------------------------------------------------------------------------
    def reset(self, task: str | Task | None = None, seed: int | None = None,
              options: dict[str, Any] | None = None):
        """Start an episode: the phone reset (minimal, or hard every ``hard_reset_every``),
        then the task's setup phase, if any. Returns ``(obs, info)``.

        Raises:
            PhaseFailed: the setup failed (an infrastructure failure, never the agent's:
                fleets record an INFRA truncation naming the phase).

        ``options`` (as gymnasium's reset options): ``{"day": d}`` moves the phone to drift
        day ``d`` from this episode on, so a fleet's phones follow a run's calendar without
        being rebuilt (:class:`~digirl_lite.train.DigiRLConfig` ``days_per_iteration``)."""
        if self._closed:
            raise RuntimeError("this environment is closed")
        for name, value in (options or {}).items():
            if name != "day":
                raise ValueError(f"unknown reset option {name!r} (SimPhoneEnv takes 'day')")
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"reset option day must be an int >= 1, got {value!r}")
            self.day = value
        self.load_task(task, seed)
        self._steps = 0
        self._done = False
        self._last_action_text: str | None = None
        self.judge.reset()
        obs, _ = self._observe()
        self._reached = reached_first_milestone(self.state, self.task)
        info = {"task": self.task.text, "success": is_success(self.state, self.task),
                "horizon": self.horizon, "reset": self.last_reset,
                SETUP: "done" if self.task.setup is not None else None}
        obs = self._with_tree(obs, info)
        self._obs = obs
        return obs, info

    def load_task(self, task: str | Task | None = None, seed: int | None = None) -> Task:
        """Reseed (when ``seed`` is given), pick ``task`` (None: drawn from ``tasks``), reset
        the phone to the launcher of ``day`` (hard or minimal, :attr:`last_reset`) and run
        the task's setup: the phone's part of :meth:`reset`, which the served phone's
        ``digirl: setTask`` shares (:mod:`digirl_lite.envs.sim.serve`).

        Raises:
            PhaseFailed: the setup failed (``Faults.setup_failure``, or a phase that did
                not put the phone where it says).
        """
        self._submitted = []  # a new task: its episode has searched for nothing yet
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        if task is None:
            task = self.tasks[int(self.rng.integers(len(self.tasks)))]
        self.task = task if isinstance(task, Task) else parse_task(task)
        self.horizon = self._fixed_horizon or self.task.horizon
        hard = self.state is None or self._hard_next \
            or hard_reset_due(self._since_hard, self.hard_reset_every)
        self.state = (initial_state(self.day, self.layout) if hard
                      else minimal_reset(self.state, self.day))
        self._since_hard = 1 if hard else self._since_hard + 1
        self.last_reset, self._hard_next = ("hard" if hard else "minimal"), False
        setup = self.task.setup
        if setup is not None:
            self._done = True  # no step until a setup has succeeded
            if self.faults.setup_failure > 0 and self.rng.random() < self.faults.setup_failure:
                self._hard_next = True
                raise PhaseFailed(SETUP, f"simulated fault: the phone did not reach {setup} "
                                         f"for {self.task.text!r}")
            self.state = apply_phase(self.state, setup)
            if not phase_reached(self.state, setup):  # pragma: no cover - a world bug
                self._hard_next = True
                raise PhaseFailed(SETUP, f"the phone is not where {setup} puts it")
        return self.task

    def _teardown(self, info: dict[str, Any]) -> None:
        """After an execution that ended on the agent's account: the task's teardown, if
        any (``info["teardown"]``: ``"done"`` or why it failed; a failure makes the next
        reset hard). The observation the agent ended on stays the episode's last."""
        teardown = self.task.teardown
        if teardown is None:
            return
        if self.faults.teardown_failure > 0 and self.rng.random() < self.faults.teardown_failure:
            self._hard_next = True
            info[TEARDOWN] = f"failed: simulated fault: the phone did not reach {teardown}"
            return
        self.state = apply_phase(self.state, teardown)
        info[TEARDOWN] = "done"

    def apply_gesture(self, gesture: Gesture) -> list[str] | None:
        """Do ``gesture`` on the phone with a step's random draws in their order: the crash
        fault, the world's surprises, the latency fault (slept here).

        :meth:`step` and the served phone (:mod:`digirl_lite.envs.sim.serve`) both go
        through here, so the same seed and gestures give the same screens in both.

        Returns:
            The surprises that appeared, or None when the device crashed (state unchanged).
        """
        if self.faults.crash > 0 and self.rng.random() < self.faults.crash:
            return None
        before = self.state
        self.state = transition(self.state, gesture, self.rng, self.surprises)
        self._recovered = recoveries_between(before, self.state, gesture)
        p = self.state.page
        if (p.query and p != before.page and p.kind in ("shop_results", "google_results")
                and before.page.kind not in ("shop_product", "web_result")):  # not a BACK
            self._submitted.append(p.query)
        if self.faults.latency_median_s > 0:
            time.sleep(math.exp(math.log(self.faults.latency_median_s)
                                + self.faults.latency_sigma * self.rng.standard_normal()))
        return surprises_between(before, self.state)

    def capture(self) -> tuple[Image.Image, str]:
        """One screenshot, ``(image, screen id)``: with probability ``faults.blank_screenshot``
        (one draw) an all-white capture whose id is ``"blank"``, else the screen. Retrying is
        the caller's: :meth:`_observe` here, the client (``AndroidEnv``) over the wire."""
        if self.faults.blank_screenshot > 0 and self.rng.random() < self.faults.blank_screenshot:
            return blank_screen(self.renderer.width, self.renderer.height), BLANK_CAPTURE
        sid = screen_key(self.state)
        return self.renderer.render(self.state, sid), sid

    def _observe(self) -> tuple[Observation, int]:
        """Capture the screen, retrying blank captures; returns (obs, blank captures)."""
        blanks = 0
        img, sid = self.capture()
        while sid == BLANK_CAPTURE and blanks < self.faults.blank_retries:
            blanks += 1
            img, sid = self.capture()
        if sid == BLANK_CAPTURE:
            blanks += 1  # still blank after every retry
        prompt = build_prompt(self.task.text, self._last_action_text)
        obs = Observation(img, prompt, self.task.text, self._steps, sid,
                          self.state if self.privileged_state else None)
        return obs, blanks

    def step(self, action_text: str):
        """Apply one action string. Returns ``(obs, reward, terminated, truncated, info)``.

        Malformed text is an invalid action: a no-op that costs a step (see
        :mod:`digirl_lite.actions`); ``info["invalid_reason"]`` says why.
        """
        if self._done or self.state is None:
            raise RuntimeError("the episode is over (or never started): call reset()")
        t0 = time.perf_counter()
        action: Action = parse_action(action_text)
        self._steps += 1
        info: dict[str, Any] = {"step": self._steps, "action": action, "truncation": None,
                                "reason": None, "invalid_reason": action.invalid_reason}
        prev_obs = self._obs
        surprises = self.apply_gesture(to_gesture(action, WIDTH, HEIGHT))
        if surprises is None:
            self._done = self._hard_next = True  # teardown skipped: the device is gone
            info.update(truncation=TRUNCATION_INFRA, verdict=None, success=False,
                        true_success=None,
                        reason=f"simulated device crash at step {self._steps}: the device "
                               f"stopped answering")
            return self._obs, 0.0, False, True, info
        info["surprises"] = surprises
        if action.is_valid:
            self._last_action_text = format_action(action)
        else:
            raw = action_text if isinstance(action_text, str) else repr(action_text)
            self._last_action_text = raw[:MAX_PROMPT_ACTION_CHARS]
        obs, blanks = self._observe()
        info["blank_captures"] = blanks
        self._obs = obs
        if obs.screen_id == BLANK_CAPTURE:
            self._done = self._hard_next = True
            info.update(truncation=TRUNCATION_INFRA, verdict=None, success=False,
                        true_success=None,
                        reason=f"blank screenshot at step {self._steps} after "
                               f"{self.faults.blank_retries} retries")
            return obs, 0.0, False, True, info
        t_env = time.perf_counter() - t0
        result = self._judge(prev_obs, obs)
        success = is_success(self.state, self.task)
        self._reached = self._reached or reached_first_milestone(self.state, self.task)
        reward = result.reward
        terminated = result.verdict is Verdict.SUCCESS or action.ends_episode
        truncated = not terminated and self._steps >= self.horizon
        if truncated:
            info["truncation"] = TRUNCATION_BUDGET
            info["reason"] = f"step budget H = {self.horizon} ran out"
        self._done = terminated or truncated
        if self._done:
            self._teardown(info)
        info["recovered"] = list(self._recovered)  # ground truth, for the reports
        if self._done:
            info["failure_cause"] = failure_cause(self.state, self.task,
                                                  tuple(self._submitted), action.ends_episode)
        info.update(success=success, true_success=success,
                    reached_first_milestone=self._reached,
                    verdict=result.verdict, judge_reply=result.reply,
                    judge_skipped=result.skipped,
                    timings={"env_s": t_env, "judge_s": result.latency_s})
        obs = self._with_tree(obs, info)
        self._obs = obs
        return obs, reward, terminated, truncated, info

    def _with_tree(self, obs: Observation, info: dict[str, Any]) -> Observation:
        """With ``ui_tree`` on: the screen's nodes in ``info["ui_tree"]`` and on ``obs``."""
        if not self.ui_tree:
            return obs
        nodes = ui_nodes(self.state)
        info["ui_tree"] = nodes
        return dataclasses.replace(obs, ui_tree=tuple(nodes))

    def _judge(self, prev: Observation | None, cur: Observation) -> JudgeResult:
        t = time.perf_counter()
        try:
            r = self.judge.judge(self.task.text, prev.screenshot if prev else None,
                                 cur.screenshot, state=self.state)
        except Exception as e:  # a judge failure must not end the run or become a 0
            return JudgeResult(Verdict.UNJUDGED, skipped=f"judge raised {type(e).__name__}: {e}",
                               latency_s=time.perf_counter() - t)
        if r.latency_s == 0.0:
            r = JudgeResult(r.verdict, r.reply, r.skipped, r.calls, r.tokens,
                            time.perf_counter() - t)
        return r

    def close(self) -> None:
        self._closed = True
        self._done = True
        self.renderer._cache.clear()

    def __enter__(self) -> SimPhoneEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SimEnvFactory:
    """A picklable ``slot -> SimPhoneEnv`` for fleets: every environment gets its own
    judge (built from ``judge`` config, see :func:`digirl_lite.envs.judges.make_judge`) and seed.

    Args:
        judge: judge config (None: the oracle).
        seed: environment ``slot`` is seeded ``seed + slot`` (episodes reseed on reset).
        **env_kwargs: passed to :class:`SimPhoneEnv` (tasks, day, surprises, faults, ...).
    """

    def __init__(self, judge: dict | None = None, seed: int = 0, **env_kwargs: Any) -> None:
        self.judge = judge
        self.seed = seed
        self.env_kwargs = env_kwargs

    def __call__(self, slot: int = 0) -> SimPhoneEnv:
        from digirl_lite.envs.judges import make_judge

        return SimPhoneEnv(judge=make_judge(self.judge), seed=self.seed + slot,
                           **self.env_kwargs)
