"""The task lifecycle and the reset between episodes (spec/DARWIN.md A.2, A.3).

A task may carry a **setup** phase before its execution (the agent's episode) and a
**teardown** phase after it. Transitions are success-gated:

* the execution runs only when the setup succeeded; a setup that fails raises
  :class:`PhaseFailed`, which every fleet (and :func:`~digirl_lite.rollout.run_episode`)
  records as an infrastructure truncation (``Ending.INFRA``, its ``truncation_reason``
  naming the phase): not the agent's doing, never trained on as a failure;
* the teardown runs after an execution that ended on the agent's account (success, a stop
  action, or the step budget spent), whatever the agent achieved: a teardown is a clean-up
  (empty the cart, close the app) that the next task needs either way. After an
  infrastructure truncation it is skipped (the device is in an unknown state; the fleet
  restarts it). A teardown that fails leaves the episode's outcome as it was and makes the
  next reset a hard one, since the state it should have cleaned is still there (so does an
  infrastructure fault, where the phone has a hard reset).

Between episodes the phone gets Darwin's **minimal reset** (back to the home screen, the
rest of its state kept: a simulated phone keeps the sites it has seen, a real one its apps'
data) and, every ``hard_reset_every`` episodes, a **hard reset** to its saved state
(:func:`hard_reset_due`), which keeps tasks from saturating on state left by earlier ones.

How a phase is written depends on the phone: the simulator's is declarative
(:class:`~digirl_lite.envs.sim.tasks.SimPhase`: start on a page, with a search typed),
a device's is a list of :class:`DeviceCommand` sent through Appium. Both come from task data
or the config, never from the model: no text a policy writes reaches a phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SETUP", "TEARDOWN", "PhaseFailed", "hard_reset_due", "DeviceCommand",
           "device_commands", "run_phase"]

SETUP = "setup"
TEARDOWN = "teardown"


class PhaseFailed(RuntimeError):
    """A setup (or teardown) phase did not succeed: an infrastructure failure.

    Attributes:
        phase: ``"setup"`` or ``"teardown"``.
    """

    def __init__(self, phase: str, reason: str) -> None:
        self.phase = phase
        super().__init__(f"{phase} phase failed: {reason}")


def hard_reset_due(since_hard: int, every: int) -> bool:
    """Whether the next reset is a hard one, ``since_hard`` episodes after the last hard
    reset, when one comes every ``every`` episodes (0: never; 1: every episode starts from
    the saved phone). A phone's first reset, and the one after a failed teardown or an
    infrastructure fault, are hard whatever this says (its state is unknown)."""
    if since_hard < 0 or every < 0:
        raise ValueError(f"since_hard and every must be >= 0, got {since_hard}, {every}")
    return every > 0 and since_hard >= every


_KINDS = ("tap", "swipe", "key", "back", "script")


@dataclass(frozen=True)
class DeviceCommand:
    """One command of a device's setup, teardown or hard reset, sent through Appium.

    Written in a config as a JSON object with exactly one of these keys:

    * ``{"tap": [x, y]}``: a tap at pixel (x, y);
    * ``{"swipe": [x0, y0, x1, y1]}``: a swipe;
    * ``{"key": 3}``: an Android keycode (3 Home, 4 Back, 66 Enter);
    * ``{"back": true}``: the driver's Back;
    * ``{"script": "mobile: startActivity", "args": {...}}``: an Appium execute-script
      extension (``mobile: shell`` needs the server's ``--relaxed-security``), optionally
      with ``"expect": value``: the phase fails unless the script returns ``value`` (the
      phase's success check).

    Attributes:
        kind: one of ``tap``, ``swipe``, ``key``, ``back``, ``script``.
        points: the pixels of a tap (x, y) or a swipe (x0, y0, x1, y1).
        keycode: a ``key`` command's keycode.
        script, args: a ``script`` command's extension name and arguments.
        expect: what a ``script`` must return (None: anything).
    """

    kind: str
    points: tuple[int, ...] = ()
    keycode: int | None = None
    script: str | None = None
    args: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)
    expect: Any = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"command kind must be one of {_KINDS}, got {self.kind!r}")
        need = {"tap": 2, "swipe": 4}.get(self.kind, 0)
        if len(self.points) != need or not all(isinstance(p, int) and p >= 0
                                               for p in self.points):
            raise ValueError(f"a {self.kind} command takes {need} pixel coordinates "
                             f"(non-negative ints), got {list(self.points)}")
        if (self.kind == "key") != isinstance(self.keycode, int) or isinstance(self.keycode,
                                                                                bool):
            raise ValueError(f"a key command (and only it) has an int keycode, got "
                             f"{self.keycode!r}")
        if (self.kind == "script") != isinstance(self.script, str) or \
                (self.script is not None and not self.script.strip()):
            raise ValueError(f"a script command (and only it) names its script, got "
                             f"{self.script!r}")
        if self.kind != "script" and (self.args or self.expect is not None):
            raise ValueError(f"args and expect belong to script commands, not {self.kind}")
        if not isinstance(self.args, dict):
            raise ValueError(f"script args must be a JSON object, got {self.args!r}")

    @classmethod
    def from_dict(cls, d: Any) -> DeviceCommand:
        """Parse the JSON form (see the class docstring); ValueError saying what is wrong."""
        if isinstance(d, DeviceCommand):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"a device command is a JSON object, got {d!r}")
        kinds = [k for k in _KINDS if k in d]
        extra = sorted(set(d) - set(_KINDS) - {"args", "expect"})
        if len(kinds) != 1 or extra:
            raise ValueError(f"a device command has exactly one of {list(_KINDS)} (and, for a "
                             f"script, 'args' and 'expect'); got keys {sorted(d)}")
        kind = kinds[0]
        v = d[kind]
        if kind in ("tap", "swipe"):
            if not isinstance(v, (list, tuple)):
                raise ValueError(f"{kind}: a list of pixel coordinates, got {v!r}")
            return cls(kind, points=tuple(v), args=d.get("args", {}), expect=d.get("expect"))
        if kind == "key":
            return cls(kind, keycode=v, args=d.get("args", {}), expect=d.get("expect"))
        if kind == "back":
            if v is not True:
                raise ValueError(f"back: true, got {v!r}")
            return cls(kind, args=d.get("args", {}), expect=d.get("expect"))
        return cls(kind, script=v, args=d.get("args", {}), expect=d.get("expect"))

    def run(self, device: Any) -> None:
        """Send this command to ``device`` (an :class:`~digirl_lite.envs.android.AppiumDevice`
        or anything with its ``perform`` and ``execute``).

        Raises:
            RuntimeError: a ``script`` returned something other than ``expect``.
            DeviceUnavailable, DeviceRefused: from the device.
        """
        from digirl_lite.actions import Gesture

        if self.kind == "tap":
            x, y = self.points
            device.perform(Gesture("tap", start=(x, y), end=(x, y)))
        elif self.kind == "swipe":
            x0, y0, x1, y1 = self.points
            device.perform(Gesture("swipe", start=(x0, y0), end=(x1, y1)))
        elif self.kind == "key":
            device.perform(Gesture("key", keycode=self.keycode))
        elif self.kind == "back":
            device.perform(Gesture("back"))
        else:
            out = device.execute(self.script, dict(self.args))
            if self.expect is not None and out != self.expect:
                raise RuntimeError(f"{self.script} returned {out!r}, expected "
                                   f"{self.expect!r}"[:300])

    def __str__(self) -> str:
        if self.kind == "script":
            return f"script {self.script}"
        if self.kind == "key":
            return f"key {self.keycode}"
        return f"{self.kind} {list(self.points)}" if self.points else self.kind


def device_commands(commands: Any, where: str = "commands") -> tuple[DeviceCommand, ...]:
    """A phase's commands from their JSON form (a list); ValueError naming ``where[i]``."""
    if commands is None:
        return ()
    if not isinstance(commands, (list, tuple)):
        raise ValueError(f"{where}: a list of device commands, got {type(commands).__name__}")
    out = []
    for i, c in enumerate(commands):
        try:
            out.append(DeviceCommand.from_dict(c))
        except ValueError as e:
            raise ValueError(f"{where}[{i}]: {e}") from None
    return tuple(out)


def run_phase(device: Any, phase: str, commands: tuple[DeviceCommand, ...]) -> None:
    """Send a phase's ``commands`` in order; the first that fails ends it.

    Raises:
        PhaseFailed: naming the phase, the command (its index and what it is) and the error.
    """
    for i, c in enumerate(commands):
        try:
            c.run(device)
        except Exception as e:  # a device error, a refusal or a failed check: all infra
            raise PhaseFailed(phase, f"command {i} ({c}): {type(e).__name__}: "
                                     f"{str(e)[:300]}") from e
