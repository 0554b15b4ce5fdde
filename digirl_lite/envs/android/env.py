"""``AndroidEnv``: a real (emulated) Android phone behind the shared environment interface.

The same episode rules as the simulated phone (:mod:`digirl_lite.envs.sim.env`): H steps, a
judge after every step, STATUS_TASK_COMPLETE / TASK_IMPOSSIBLE end the episode, malformed
text is a no-op that costs a step. What only a real device does: screenshots can come back
blank (retried while more than 93.4% near-white, spec/DIGIRL.md section 4), calls can hang
(per-call timeouts) and sessions can drop (reconnects). A device that stays unreachable ends
the episode as an infrastructure truncation, never as an agent failure.

The task lifecycle (spec/DARWIN.md A.3, :mod:`digirl_lite.envs.lifecycle`): Appium commands
run as a setup before each episode (a failure raises :class:`PhaseFailed`: an
infrastructure truncation) and as a teardown after it; between episodes the minimal reset
(Home) with a hard reset every ``hard_reset_every`` episodes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from digirl_lite.actions import KEYCODE_HOME, parse_action, to_gesture
from digirl_lite.data.records import Verdict
from digirl_lite.envs.android.device import (
    AndroidConfig,
    AppiumDevice,
    DeviceRefused,
    DeviceUnavailable,
)
from digirl_lite.envs.base import TRUNCATION_BUDGET, TRUNCATION_INFRA, Observation
from digirl_lite.envs.lifecycle import (
    SETUP,
    TEARDOWN,
    DeviceCommand,
    PhaseFailed,
    device_commands,
    hard_reset_due,
    run_phase,
)
from digirl_lite.judge.base import JudgeResult
from digirl_lite.judge.guards import is_blank
from digirl_lite.judge.oracle import EnvJudge
from digirl_lite.prompts import build_prompt

__all__ = ["AndroidEnv"]


def _tree_of(info: dict[str, Any]) -> tuple | None:
    nodes = info.get("ui_tree")
    return tuple(nodes) if nodes is not None else None


class AndroidEnv:
    """One Android device as an :class:`~digirl_lite.envs.base.Env`.

    Args:
        config: how to reach the device (:class:`AndroidConfig`).
        judge: gives the rewards (e.g. ``make_judge({...})``); None: every step is UNJUDGED
            (recorded, never trained on). An :class:`~digirl_lite.judge.oracle.EnvJudge` asks the
            device's own success check (``digirl: isSuccess``), and the device is then told
            each episode's task (``digirl: setTask``).
        horizon: step budget H (20 Web Shopping, 10 General).
        reset: ``"home"`` (Darwin's minimal reset: press Home, state persists), ``"task"``
            (press Home, then the device's own task set-up ``digirl: setTask``, seeded with
            the episode's seed: a served simulated phone starts the task afresh) or a
            callable ``() -> None`` (e.g. an :class:`EmulatorManager` snapshot reset).
        device: an already-built :class:`AppiumDevice` (tests); else one is connected lazily.
        sleep: ``time.sleep`` (tests pass a no-op).
        setup: :class:`~digirl_lite.envs.lifecycle.DeviceCommand` s (or their JSON form)
            sent after the reset, before the first screenshot; the first that fails raises
            :class:`PhaseFailed` (``"setup"``), an infrastructure failure.
        teardown: commands sent after an episode that ended on the agent's account (not
            after an infrastructure fault); a failure is reported in ``info["teardown"]``
            and makes the next reset hard.
        hard_reset_every: with ``reset="home"``, a hard reset instead of Home every this
            many episodes, and on the first (0: never; spec/DARWIN.md A.2).
        hard_reset: what a hard reset is: a callable ``() -> None`` (an emulator's snapshot
            load) or commands (e.g. ``mobile: shell`` ``pm clear``); required when
            ``hard_reset_every`` > 0.
        ground_truth: at each episode's last step, ask the device's own success check
            (``digirl: isSuccess``) for the truth beside the judge's verdict,
            ``info["true_success"]`` and ``info["reached_first_milestone"]`` (issue 32).
            Only a device told the episode's task can answer (``reset="task"`` or the
            :class:`~digirl_lite.judge.oracle.EnvJudge`: a served simulated phone); with
            the EnvJudge the last step's verdict is that check, asked once. A device that
            refuses the command (a real phone) is not asked again and its episodes carry no
            truth (None): never an error. False: never ask.
    """

    def __init__(self, config: AndroidConfig, judge: Any = None, horizon: int = 20,
                 reset: Any = "home", device: AppiumDevice | None = None,
                 sleep: Any = time.sleep, setup: Sequence[Any] = (),
                 teardown: Sequence[Any] = (), hard_reset_every: int = 0,
                 hard_reset: Any = None, ground_truth: bool = True) -> None:
        if horizon <= 0:
            raise ValueError(f"horizon must be positive, got {horizon}")
        if reset not in ("home", "task") and not callable(reset):
            raise ValueError("reset must be 'home', 'task' or a callable")
        if isinstance(hard_reset_every, bool) or not isinstance(hard_reset_every, int) \
                or hard_reset_every < 0:
            raise ValueError(f"hard_reset_every must be an int >= 0, got {hard_reset_every!r}")
        if hard_reset_every and (reset != "home" or not hard_reset):
            raise ValueError("hard_reset_every needs reset='home' (the other resets are hard "
                             "every episode) and a hard_reset (a callable or commands)")
        self.setup: tuple[DeviceCommand, ...] = device_commands(setup, SETUP)
        self.teardown: tuple[DeviceCommand, ...] = device_commands(teardown, TEARDOWN)
        self.hard_reset_every = hard_reset_every
        self._hard_reset = hard_reset if callable(hard_reset) or not hard_reset \
            else device_commands(hard_reset, "hard_reset")
        self._since_hard: int | None = None  # episodes since the last hard reset (None: none)
        self._hard_next = False
        self.last_reset: str | None = None
        """How the current episode's device was reset: ``"hard"``, ``"home"``, ``"task"`` or
        ``"callable"``."""
        self.config, self.judge, self.horizon = config, judge, horizon
        self._reset, self._sleep = reset, sleep
        self.device = device
        self._session = 0
        self.task: str | None = None
        self._steps = 0
        self._done = True
        self._obs: Observation | None = None
        self._last_action_text: str | None = None
        self.ground_truth = bool(ground_truth)
        self._no_check = False  # the device refused digirl: isSuccess (a real phone)
        self._last_check: dict[str, Any] | None = None  # the EnvJudge's answer this step

    def _device(self) -> AppiumDevice:
        if self.device is None:
            self.device = AppiumDevice(self.config, connect=False)
        return self.device

    def _capture(self) -> tuple[Any, int]:
        """A screenshot, retried while blank; returns (image or None if still blank,
        blank captures)."""
        dev = self._device()
        for blanks in range(self.config.blank_retries + 1):
            img = dev.screenshot()
            if not is_blank(img):
                return img, blanks
            if blanks < self.config.blank_retries:
                self._sleep(self.config.blank_wait_s)
        return None, self.config.blank_retries + 1

    def _observe(self, img) -> Observation:
        return Observation(img, build_prompt(self.task, self._last_action_text), self.task,
                           self._steps)

    def reset(self, task: Any = None, seed: int | None = None):
        """Start an episode: the reset (Home, or a hard reset every ``hard_reset_every``),
        then the setup commands. A device that cannot be reached raises
        :class:`DeviceUnavailable`, a setup that fails :class:`PhaseFailed` (a fleet records
        both as infrastructure failures)."""
        if task is None:
            raise ValueError("AndroidEnv.reset needs a task (an instruction)")
        self.task = getattr(task, "text", None) or str(task)
        self._done = True  # no step until the reset and the setup have succeeded
        if callable(self._reset):
            self._reset_by(self._reset)
            self.last_reset = "callable"
        elif self._reset == "task" or isinstance(self.judge, EnvJudge):
            # the device's own task set-up (it starts on the launcher); a real phone is not
            # seeded, a served simulated phone takes the episode's seed
            self._device().execute("digirl: setTask", {"task": self.task, "seed": seed})
            self.last_reset = "task"
        else:
            k = self.hard_reset_every
            hard = k > 0 and (self._since_hard is None or self._hard_next
                              or hard_reset_due(self._since_hard, k))
            self._hard_next = False
            if hard:
                if callable(self._hard_reset):
                    self._reset_by(self._hard_reset)
                else:
                    run_phase(self._device(), "hard reset", self._hard_reset)
            else:
                self._device().press_keys([KEYCODE_HOME])
            self._since_hard = 1 if hard else (self._since_hard or 0) + 1
            self.last_reset = "hard" if hard else "home"
        if self.setup:
            try:
                run_phase(self._device(), SETUP, self.setup)
            except PhaseFailed:
                self._hard_next = True
                raise
            self._sleep(self.config.settle_s)
        self._steps, self._done, self._last_action_text = 0, False, None
        if self.judge is not None:
            self.judge.reset()
        img, _ = self._capture()
        if img is None:
            raise DeviceUnavailable("blank screen after reset")
        self._obs = self._observe(img)
        self._session = getattr(self._device(), "sessions", 0)  # the episode's session
        info = {"task": self.task, "horizon": self.horizon, "reset": self.last_reset,
                SETUP: "done" if self.setup else None}
        self._read_tree(info)
        self._obs = dataclasses.replace(self._obs, ui_tree=_tree_of(info))
        return self._obs, info

    def _read_tree(self, info: dict[str, Any]) -> None:
        """``info["ui_tree"]``: the screen's nodes (``config.ui_tree``); a source the parser
        cannot read, or a server that refuses the command, is ``info["ui_tree_error"]`` and
        the episode goes on. A device that cannot be reached raises as every call does."""
        if not self.config.ui_tree:
            return
        from digirl_lite.envs.uitree import UITreeError, parse_source

        try:
            info["ui_tree"] = parse_source(self._device().page_source())
        except (UITreeError, DeviceRefused) as e:
            info["ui_tree"], info["ui_tree_error"] = None, str(e)[:500]

    def _reset_by(self, fn: Any) -> None:
        fn()
        if self.device is not None:
            self.device.quit()  # the session does not survive a snapshot load

    def _teardown(self, info: dict[str, Any]) -> None:
        """The teardown commands after an episode that ended on the agent's account;
        ``info["teardown"]``: ``"done"`` or why it failed (the next reset is then hard)."""
        if not self.teardown:
            return
        try:
            run_phase(self._device(), TEARDOWN, self.teardown)
        except PhaseFailed as e:
            self._hard_next = True
            info[TEARDOWN] = f"failed: {e}"[:500]
            return
        info[TEARDOWN] = "done"

    def _infra(self, info: dict, reason: str):
        self._done = self._hard_next = True
        info.update(truncation=TRUNCATION_INFRA, verdict=None, success=False, reason=reason)
        return self._obs, 0.0, False, True, info

    def step(self, action_text: str):
        """Apply one action string. Returns ``(obs, reward, terminated, truncated, info)``."""
        if self._done:
            raise RuntimeError("the episode is over (or never started): call reset()")
        t0 = time.perf_counter()
        action = parse_action(action_text)
        self._steps += 1
        info: dict[str, Any] = {"step": self._steps, "action": action, "truncation": None,
                                "reason": None, "invalid_reason": action.invalid_reason}
        prev = self._obs
        try:
            dev = self._device()
            if action.is_valid and not action.ends_episode:
                dev.perform(to_gesture(action, *dev.window_size()))
                self._sleep(self.config.settle_s)
            img, blanks = self._capture()
            if img is not None:
                self._read_tree(info)
        except DeviceUnavailable as e:
            return self._infra(info, f"step {self._steps}: {e}")
        info["blank_captures"] = blanks
        if img is None:
            return self._infra(info, f"blank screenshot at step {self._steps} after "
                                     f"{self.config.blank_retries} retries")
        self._last_action_text = action_text if action.is_valid else str(action_text)[:300]
        self._obs = dataclasses.replace(self._observe(img), ui_tree=_tree_of(info))
        t_env = time.perf_counter() - t0
        try:
            result = self._judge(prev, self._obs)
        except DeviceUnavailable as e:  # the device's own check could not be reached
            return self._infra(info, f"step {self._steps}: {e}")
        if getattr(self._device(), "sessions", 0) != self._session:
            # a reconnect opened a new session mid-episode: the device (or its server) may
            # have restarted, and its screen is no longer where the episode left it; going on
            # would judge the agent on a screen it did not reach (issue 29)
            return self._infra(info, f"step {self._steps}: the device's session was lost "
                                     "mid-episode and a new one opened (a restarted device "
                                     "or server): the episode cannot go on")
        terminated = result.verdict is Verdict.SUCCESS or action.ends_episode
        truncated = not terminated and self._steps >= self.horizon
        if truncated:
            info.update(truncation=TRUNCATION_BUDGET,
                        reason=f"step budget H = {self.horizon} ran out")
        self._done = terminated or truncated
        if self._done:
            self._read_truth(info, result)  # before the teardown changes the device
            self._teardown(info)
        info.update(success=result.verdict is Verdict.SUCCESS, verdict=result.verdict,
                    judge_reply=result.reply, judge_skipped=result.skipped,
                    timings={"env_s": t_env, "judge_s": result.latency_s})
        return self._obs, result.reward, terminated, truncated, info

    def _read_truth(self, info: dict[str, Any], result: JudgeResult) -> None:
        """``info["true_success"]`` and ``info["reached_first_milestone"]`` from the device's
        own check (see ``ground_truth``); left out where there is none."""
        if not self.ground_truth or self.last_reset != "task" or self._no_check:
            return
        answer = self._last_check if result.verdict is not Verdict.UNJUDGED else None
        if answer is None:
            try:
                answer = self._device().execute("digirl: isSuccess")
            except DeviceRefused:
                self._no_check = True  # a device without the check: not asked again
                return
            except DeviceUnavailable:
                return  # the episode is over; its truth stays unknown
        if not isinstance(answer, dict):
            return
        for key, name in (("success", "true_success"),
                          ("reached_first_milestone", "reached_first_milestone")):
            v = answer.get(key)
            info[name] = v if isinstance(v, bool) else None

    def _judge(self, prev: Observation | None, cur: Observation) -> JudgeResult:
        t = time.perf_counter()
        self._last_check = None
        if self.judge is None:
            return JudgeResult(Verdict.UNJUDGED, skipped="no judge configured")
        if isinstance(self.judge, EnvJudge):
            try:
                answer = self._device().execute("digirl: isSuccess")
                ok = bool(answer["success"])
                self._last_check = answer
            except (DeviceRefused, KeyError, TypeError) as e:
                return JudgeResult(Verdict.UNJUDGED, latency_s=time.perf_counter() - t,
                                   skipped=f"the device's success check failed: {e}"[:500])
            return JudgeResult(Verdict.SUCCESS if ok else Verdict.FAILURE,
                               reply=f"Status: {'success' if ok else 'failure'}",
                               latency_s=time.perf_counter() - t)
        try:
            r = self.judge.judge(self.task, prev.screenshot if prev else None, cur.screenshot)
        except Exception as e:  # a judge failure must not end the run or become a 0
            return JudgeResult(Verdict.UNJUDGED, skipped=f"judge raised {type(e).__name__}: {e}",
                               latency_s=time.perf_counter() - t)
        return r

    def close(self) -> None:
        self._done = True
        if self.device is not None:
            self.device.quit()
