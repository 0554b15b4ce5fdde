"""The simulated phone as a Gymnasium environment (issue 31, item 1).

``import digirl_lite`` registers two ids (:data:`digirl_lite.GYM_IDS`)::

    import gymnasium as gym
    import digirl_lite  # noqa: F401  (registers the ids)

    env = gym.make("digirl_lite/SimPhone-v0", task="Go to ebay.com, search for 'logitech g910'",
                   seed=0)                       # Web Shopping
    env = gym.make("digirl_lite/SimPhoneGeneral-v0")   # the General world
    envs = gym.make_vec("digirl_lite/SimPhone-v0", num_envs=4)

**Observation** (a ``Dict``): ``screenshot`` (``Box`` uint8, ``screen_size`` = (height, width),
the phone's 1080 x 2280 screen scaled down), ``goal`` (``Text``: the instruction), ``prompt``
(``Text``: what the library's policies read: ``Previous Actions: ... Goal: ...``), ``step``
(``Discrete``: steps taken), and ``ui_tree`` (``Text``: one line per node an agent can act on,
:func:`~digirl_lite.envs.uitree.tree_text`) when ``ui_tree=True``. Text outside the spaces'
character set (printable characters of Unicode's basic plane, and newlines) is written as
U+FFFD.

**Action**: ``Text`` in the library's action format (what
:func:`~digirl_lite.actions.format_action` writes: ``Action Decision: "action_type":
"DUAL_POINT", "touch_point": "[y, x]", "lift_point": "[y, x]", "typed_text": ""``), or with
``action_space="structured"`` a ``Dict`` (``action_type``: ``Discrete`` over
:data:`ACTION_TYPES`; ``touch_point``, ``lift_point``: ``Box`` (y, x) in [0, 1];
``typed_text``: ``Text``) for agents that do not write text. An action that does not parse
(or a structured one that is not an action: a TYPE with no text) is an unparseable step, as
everywhere in the library: reward 0, a no-op that costs a step, ``info["invalid_reason"]``
says why; never an exception.

**Reward**: the environment's ground-truth check (the simulator's oracle judge) by default;
``judge=`` a judge config (:func:`~digirl_lite.envs.judges.make_judge`, e.g. the calibrated
noisy judge or a VLM judge) makes the reward that judge's verdict, with the ground truth
still in ``info["success"]``. ``terminated``: the task is done (the judge's success verdict)
or the agent declared it over (``STATUS_TASK_COMPLETE`` / ``TASK_IMPOSSIBLE``);
``truncated``: the step budget H ran out, or the phone failed (a simulated fault:
``info["truncation"]`` is ``"infra"``, not the agent's failure). ``render_mode="rgb_array"``
renders the screen at ``screen_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

try:
    import gymnasium as gym
    from gymnasium import spaces
except ImportError as e:  # pragma: no cover - gymnasium is a base dependency
    raise ImportError("digirl_lite.envs.sim.gym needs gymnasium: pip install "
                      "'gymnasium>=1.0'") from e

from digirl_lite.actions import NO_POINT, Action, ActionParseError, ActionType, format_action
from digirl_lite.envs.sim.env import SimPhoneEnv

__all__ = ["SimPhoneGymEnv", "ACTION_TYPES", "WORLDS", "CHARSET", "structured_action_text"]

WORLDS = ("webshop", "general")
ACTION_TYPES = tuple(t for t in ActionType if t is not ActionType.INVALID)
"""The structured action space's ``action_type`` values, in order."""
CHARSET = "".join(c for c in map(chr, range(32, 0x10000)) if c.isprintable()) + "\n"
"""The ``Text`` spaces' characters: Unicode's basic plane's printable ones, and newline."""
_CHARS = frozenset(CHARSET)
_REPLACEMENT = "\ufffd"
MAX_TEXT = 8192
"""The longest text an observation's ``Text`` field holds (a tree is cut to it)."""
MAX_ACTION_TEXT = 1024
_OPTIONS = ("world", "split", "task", "tasks", "seed", "screen_size", "ui_tree", "max_nodes",
            "action_space", "judge", "render_mode", "horizon", "day", "surprises", "faults")


def _text(s: str, limit: int = MAX_TEXT) -> str:
    s = "".join(c if c in _CHARS else _REPLACEMENT for c in str(s))
    return s[:limit]


def structured_action_text(action: Mapping[str, Any]) -> str:
    """The action-format string a structured action stands for (the ``Dict`` action space's,
    and the OpenEnv server's structured actions): ``action_type`` (an index into
    :data:`ACTION_TYPES`, or its name), ``touch_point`` and ``lift_point`` ((y, x) in [0, 1];
    DUAL_POINT), ``typed_text`` (TYPE). One that is not an action (a TYPE with no text, a
    point off the screen, an unknown type) gives a string that does not parse and says why:
    an unparseable step, never an exception."""
    try:
        kind = action["action_type"]
        atype = ActionType(kind) if isinstance(kind, str) else ACTION_TYPES[int(kind)]
        if atype not in ACTION_TYPES:
            raise ValueError(f"{kind!r} is not an action type")
        if atype is ActionType.DUAL_POINT:
            a = Action(atype, tuple(float(v) for v in action["touch_point"]),
                       tuple(float(v) for v in action["lift_point"]))
        elif atype is ActionType.TYPE:
            a = Action(atype, NO_POINT, NO_POINT, str(action.get("typed_text", "")))
        else:
            a = Action(atype)
        return format_action(a)
    except (ActionParseError, KeyError, IndexError, TypeError, ValueError) as e:
        return f"not an action: {type(e).__name__}: {e}"[:200]


class SimPhoneGymEnv(gym.Env):
    """The simulated phone (:class:`~digirl_lite.envs.sim.env.SimPhoneEnv`) behind
    Gymnasium's API. See the module's docstring for the spaces, reward and endings.

    Args:
        world: ``"webshop"`` or ``"general"``.
        split: the instruction list ``reset()`` draws from: ``"train"`` or ``"test"`` (the
            held-out list).
        task: one instruction every episode uses (None: drawn from the split at each
            reset; ``reset(options={"task": ...})`` picks one for an episode).
        tasks: a list of instructions to draw from instead of the split.
        seed: seeds the first reset (as ``reset(seed=...)``).
        screen_size: (height, width) of the ``screenshot`` observation and of ``render()``.
        ui_tree: add the ``ui_tree`` text to the observation.
        max_nodes: the most tree lines in it.
        action_space: ``"text"`` or ``"structured"``.
        judge: a judge config for the reward (None: the ground-truth check).
        render_mode: None or ``"rgb_array"``.
        horizon: the step budget H (None: the world's, 20 Web Shopping, 10 General).
        day, surprises, faults: the simulator's drift day, surprises and faults
            (:class:`~digirl_lite.envs.sim.env.SimPhoneEnv`).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, world: str = "webshop", split: str = "train", task: str | None = None,
                 tasks: list[str] | None = None, seed: int | None = None,
                 screen_size: tuple[int, int] = (456, 216), ui_tree: bool = False,
                 max_nodes: int = 60, action_space: str = "text",
                 judge: dict[str, Any] | None = None, render_mode: str | None = None,
                 horizon: int | None = None, day: int = 1,
                 surprises: dict[str, Any] | None = None,
                 faults: dict[str, Any] | None = None, **unknown: Any) -> None:
        if unknown:
            raise ValueError(f"unknown option(s) {sorted(unknown)} for digirl_lite's SimPhone "
                             f"(its options: {', '.join(_OPTIONS)})")
        if world not in WORLDS:
            raise ValueError(f"unknown world {world!r} (one of {', '.join(WORLDS)})")
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r} (one of train, test)")
        if action_space not in ("text", "structured"):
            raise ValueError(f"unknown action_space {action_space!r} (one of text, structured)")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"unknown render_mode {render_mode!r} (only 'rgb_array')")
        try:
            h, w = (int(x) for x in screen_size)
        except (TypeError, ValueError):
            raise ValueError(f"screen_size must be (height, width), got {screen_size!r}") \
                from None
        if h < 8 or w < 8:
            raise ValueError(f"screen_size must be at least (8, 8), got {screen_size!r}")
        from digirl_lite.envs.judges import check_judge, make_judge

        check_judge(judge)  # a judge config that cannot work: refused here, naming the field
        source: Any = tasks if tasks is not None else (world if split == "train"
                                                       else f"{world}_test")
        try:
            self.sim = SimPhoneEnv(tasks=source if task is None else [task], horizon=horizon,
                                   day=day, surprises=surprises, faults=faults,
                                   judge=make_judge(judge), seed=seed, ui_tree=ui_tree)
        except Exception as e:  # an instruction the simulator cannot model, a bad option
            raise ValueError(f"digirl_lite/SimPhone ({world}): {e}") from e
        self.world, self.split, self.task = world, split, task
        self.screen_size = (h, w)
        self.ui_tree, self.max_nodes = ui_tree, max_nodes
        self.render_mode = render_mode
        self._seed = seed
        self.max_horizon = horizon or max(t.horizon for t in self.sim.tasks)
        obs = {"screenshot": spaces.Box(0, 255, (h, w, 3), np.uint8),
               "goal": spaces.Text(MAX_TEXT, charset=CHARSET),
               "prompt": spaces.Text(MAX_TEXT, charset=CHARSET),
               "step": spaces.Discrete(self.max_horizon + 1)}
        if ui_tree:
            obs["ui_tree"] = spaces.Text(MAX_TEXT, charset=CHARSET)
        self.observation_space = spaces.Dict(obs)
        self.structured = action_space == "structured"
        if self.structured:
            self.action_space = spaces.Dict({
                "action_type": spaces.Discrete(len(ACTION_TYPES)),
                "touch_point": spaces.Box(0.0, 1.0, (2,), np.float32),
                "lift_point": spaces.Box(0.0, 1.0, (2,), np.float32),
                "typed_text": spaces.Text(MAX_ACTION_TEXT, charset=CHARSET)})
        else:
            self.action_space = spaces.Text(MAX_ACTION_TEXT, charset=CHARSET)
        self._frame: np.ndarray | None = None
        self._obs = None

    # -- the conversions ------------------------------------------------------------------
    def _observation(self, obs: Any) -> dict[str, Any]:
        h, w = self.screen_size
        from PIL import Image

        frame = np.asarray(obs.screenshot.convert("RGB").resize((w, h), Image.BILINEAR),
                           dtype=np.uint8)
        self._frame = frame
        out = {"screenshot": frame, "goal": _text(obs.task), "prompt": _text(obs.prompt),
               "step": int(min(obs.step, self.max_horizon))}
        if self.ui_tree:
            from digirl_lite.envs.uitree import tree_text

            out["ui_tree"] = _text(tree_text(obs.ui_tree or (), self.max_nodes))
        return out

    def action_text(self, action: Any) -> str:
        """The action-format string an action of this env's space stands for (a structured
        action that is not an action: a string that does not parse, saying why)."""
        if not self.structured:
            return action if isinstance(action, str) else f"not a string: {action!r}"[:200]
        return structured_action_text(action)

    # -- the API --------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """``options``: ``{"task": instruction}`` (this episode's), ``{"day": d}`` (drift)."""
        super().reset(seed=seed)
        opts = dict(options or {})
        task = opts.pop("task", None)
        if seed is None and self._seed is not None:
            seed, self._seed = self._seed, None  # the constructor's seed: the first reset's
        elif seed is not None:
            self._seed = None
        try:
            obs, info = self.sim.reset(task=task, seed=seed, options=opts or None)
        except ValueError as e:
            raise ValueError(f"digirl_lite/SimPhone reset: {e}") from e
        self._obs = obs
        return self._observation(obs), self._info(info)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.sim.step(self.action_text(action))
        self._obs = obs
        return (self._observation(obs), float(reward), bool(terminated), bool(truncated),
                self._info(info))

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        # the simulator's wall-clock timings are left out: the same seed and actions give the
        # same info (Gymnasium's determinism check)
        out = {k: v for k, v in info.items()
               if k not in ("action", "ui_tree", "verdict", "timings")}
        if "action" in info:
            out["action"] = (format_action(info["action"]) if info["action"].is_valid
                             else None)
        if "verdict" in info:
            out["verdict"] = getattr(info["verdict"], "value", info["verdict"])
        out["task"] = self.sim.task.text if self.sim.task else None
        return out

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        if self._frame is None:
            raise RuntimeError("render() before reset()")
        return self._frame.copy()

    def close(self) -> None:
        self.sim.close()
        super().close()
