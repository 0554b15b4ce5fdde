"""The served simulated phone as a TRL environment: tools a language model calls (issue 31,
item 3).

TRL's ``GRPOTrainer(environment_factory=...)`` builds one environment object per rollout,
calls its ``reset(**columns)`` with the dataset row, exposes its public methods as tools the
model calls in a multi-turn tool-calling loop, and scores the rollout with its
``get_reward()``. :func:`phone_tools` gives such a class, talking to the OpenEnv server
(:mod:`digirl_lite.envs.sim.openenv`) over its WebSocket session::

    python -m digirl_lite.envs.sim.openenv --port 8000 --ui-tree --no-screenshot &

    from trl import GRPOConfig, GRPOTrainer
    from digirl_lite.envs.sim.trl_tools import phone_tools, task_dataset

    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=task_dataset("webshop"),
                          environment_factory=phone_tools("http://127.0.0.1:8000"))

The model reads the screen as the UI tree's text (one line per element, ``[id] Class "text"
(x0,y0,x1,y1) clickable``) and acts with six tools: ``tap(element)`` (the element's centre),
``type_text(text)``, ``press_back()``, ``press_home()``, ``press_enter()`` and
``task_complete()``. Each costs one step of the phone's budget H and answers with the next
screen. A tap on an id that is not on the screen is sent as what it is, an action that does
not parse: an unparseable step (it costs the step, reward 0), as everywhere in the library.
The reward is the environment's verdict summed over the episode (1 when the task is done: the
ground-truth check, or the server's judge). A tool called after the episode ended raises, and
TRL hands the model the message.
"""

from __future__ import annotations

from typing import Any

from digirl_lite.actions import Action, format_action

__all__ = ["phone_tools", "task_dataset", "SYSTEM_PROMPT", "observation_text", "tool_action",
           "TOOL_NAMES", "KEY_TOOLS"]

SYSTEM_PROMPT = (
    "You operate an Android phone to complete the user's task. After each action you see the "
    "screen as a list of elements, one per line: [id] Class \"text\" (x0,y0,x1,y1) clickable. "
    "Act with the tools: tap an element by its id, type text into the focused field, press "
    "back, home or enter, and call task_complete when the task is done.")
"""The instructions the recipe's prompts start with."""

WIDTH, HEIGHT = 1080, 2280  # the tree's pixel coordinates


def observation_text(obs: Any, horizon: int | None = None) -> str:
    """What the model reads of a :class:`~digirl_lite.envs.sim.openenv.SimPhoneObservation`:
    the goal, the step, the screen's elements, and how the episode ended when it has."""
    budget = f"/{horizon}" if horizon else ""
    lines = [f"Goal: {obs.goal}", f"Step {obs.step}{budget}. Screen:", obs.ui_tree or "(empty)"]
    if obs.invalid_reason:
        lines.insert(1, f"(the last action did not parse: {obs.invalid_reason})")
    if obs.done:
        lines.append("The episode is over: " + ("the task is done." if obs.success else
                                                 "the task was not done."))
    return "\n".join(lines)


TOOL_NAMES = ("press_back", "press_enter", "press_home", "tap", "task_complete", "type_text")
"""The tools :func:`phone_tools` exposes (in the order TRL lists them: by name)."""
KEY_TOOLS = {"press_back": "PRESS_BACK", "press_enter": "PRESS_ENTER",
             "press_home": "PRESS_HOME", "task_complete": "STATUS_TASK_COMPLETE"}
"""The tools without arguments and the action each stands for."""


class _Fault(Exception):
    """The server or the session failed (not the agent's doing)."""


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(...)``, with every failure but a refused option (ValueError: the caller's
    mistake, raised as it is) turned into :class:`_Fault`."""
    try:
        return fn(*args, **kwargs)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - connection closed, server error, timeout, ...
        raise _Fault(f"{type(e).__name__}: {e}") from e


def tool_action(name: str, arguments: dict[str, Any], ui_tree: str) -> tuple[str, str]:
    """The action string a tool call stands for on a screen whose UI tree text is
    ``ui_tree``, and a note for the model (empty but for a tap on an element the screen does
    not have). The one mapping of the tools (:func:`phone_tools`) and of agents that read
    tool calls (:mod:`digirl_lite.envs.sim.trl_warmup`). What is not a call of a tool with
    its argument is a string that does not parse (an unparseable step, as everywhere)."""
    from digirl_lite.envs.uitree import parse_tree_text

    if name == "tap":
        element = arguments.get("element")
        for node in parse_tree_text(ui_tree or ""):
            if element is not None and node.id == str(element).strip().strip("[]"):
                x, y = node.center
                return format_action(Action.tap(x=min(max(x / WIDTH, 0.0), 1.0),
                                                y=min(max(y / HEIGHT, 0.0), 1.0))), ""
        # not an element of this screen: an action that does not parse (the step is spent)
        return (f"tap {element!r}: no such element on the screen",
                f"There is no element {element!r} on this screen.")
    if name == "type_text":
        try:
            return format_action(Action("TYPE", typed_text=str(arguments.get("text", "")))), ""
        except ValueError:
            return f"type {arguments.get('text')!r}: empty text", ""
    if name in KEY_TOOLS and not arguments:
        return format_action(Action(KEY_TOOLS[name])), ""
    return f"not a tool call: {name}({arguments})"[:200], ""


def phone_tools(base_url: str, *, ui_tree_options: dict[str, Any] | None = None) -> type:
    """A class for TRL's ``environment_factory`` whose instances each hold a session on the
    OpenEnv server at ``base_url`` (:class:`~digirl_lite.envs.sim.openenv.SimPhoneClient`).

    ``reset(task=..., seed=..., **other columns)`` starts an episode on the row's task and
    seed (without them: the server's draw) with the UI tree on and no screenshot (plus
    ``ui_tree_options``, e.g. ``{"max_nodes": 40}``) and returns its first observation text.
    """
    from digirl_lite.envs.sim.openenv import SimPhoneClient

    extra = dict(ui_tree_options or {})

    class PhoneTools:
        """One rollout's phone (see :mod:`digirl_lite.envs.sim.trl_tools`)."""

        url = base_url
        resets = 0  # episodes started by every instance of the class (for reports)
        faults = 0  # episodes an infrastructure fault ended: dropped, never a reward of 0
        retries = 0  # starts that failed once and were tried again on a new connection

        def __init__(self) -> None:
            self._client = self._connect()
            self._obs: Any = None
            self.reward = 0.0
            self.done = False
            self.success = False
            self.fault: str | None = None
            self.steps = 0

        def _connect(self) -> Any:
            client = SimPhoneClient(base_url=self.url).sync()
            client.connect()
            return client

        def reset(self, **kwargs: Any) -> str:
            opts: dict[str, Any] = {"ui_tree": True, "screenshot": False, **extra}
            if kwargs.get("task") is not None:
                opts["task"] = kwargs["task"]
            if kwargs.get("seed") is not None:
                opts["seed"] = int(kwargs["seed"])
            self.reward, self.done, self.success, self.steps = 0.0, False, False, 0
            self.fault = None
            try:
                result = _call(self._client.reset, **opts)
            except _Fault:  # a lost connection: once more on a new one
                type(self).retries += 1
                try:
                    self._client = self._connect()
                    result = _call(self._client.reset, **opts)
                except Exception as e:  # noqa: BLE001 - any failure to start is the server's
                    return self._lost(e)
            type(self).resets += 1
            self._obs = result.observation
            return observation_text(self._obs)

        def get_reward(self) -> float | None:
            """The episode's reward; None (TRL leaves the rollout out of its group's baseline
            and gives it no advantage) when an infrastructure fault ended it."""
            return None if self.fault else float(self.reward)

        def _lost(self, error: BaseException) -> str:
            type(self).faults += 1
            self.fault = f"{type(error).__name__}: {error}"[:300]
            self.done = True
            return ("The phone is unavailable (an infrastructure fault); this episode does not "
                    "count.")

        def _act(self, text: str, note: str = "") -> str:
            if self.done:
                raise ValueError("The episode is over: no more actions.")
            try:
                result = _call(self._client.step, text)
            except _Fault as e:  # the session is lost mid-episode: the episode is dropped
                raise RuntimeError(self._lost(e)) from e
            self._obs = result.observation
            self.steps += 1
            self.reward += float(result.reward or 0.0)
            self.done = bool(result.done)
            self.success = bool(self._obs.success)
            return (note + "\n" if note else "") + observation_text(self._obs)

        def tap(self, element: str) -> str:
            """
            Tap an element of the screen.

            Args:
                element: The element's id, as in square brackets in the screen listing.

            Returns:
                The screen after the tap.
            """
            text, note = tool_action("tap", {"element": element},
                                     self._obs.ui_tree if self._obs else "")
            return self._act(text, note=note)

        def type_text(self, text: str) -> str:
            """
            Type text into the focused field.

            Args:
                text: The text to type.

            Returns:
                The screen after typing.
            """
            return self._act(tool_action("type_text", {"text": text}, "")[0])

        def press_back(self) -> str:
            """
            Press the back button.

            Returns:
                The screen after pressing back.
            """
            return self._act(tool_action("press_back", {}, "")[0])

        def press_home(self) -> str:
            """
            Press the home button.

            Returns:
                The screen after pressing home.
            """
            return self._act(tool_action("press_home", {}, "")[0])

        def press_enter(self) -> str:
            """
            Press enter (submits what was typed).

            Returns:
                The screen after pressing enter.
            """
            return self._act(tool_action("press_enter", {}, "")[0])

        def task_complete(self) -> str:
            """
            Declare the task done; the episode ends.

            Returns:
                How the episode ended.
            """
            return self._act(tool_action("task_complete", {}, "")[0])

        def __del__(self) -> None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - the server may be gone already
                pass

    return PhoneTools


def task_dataset(world: str = "webshop", split: str = "train", n: int | None = None,
                 seed: int = 0, tasks: list[str] | None = None) -> Any:
    """A ``datasets.Dataset`` of tasks for GRPO: ``prompt`` (the system prompt and the user's
    request; the first screen is appended by the environment's ``reset``), ``task`` and
    ``seed`` (the env seed of the row's episode), ``n`` rows drawn from the world's
    instruction list (``seed`` orders the draw), or ``tasks``."""
    import random

    from datasets import Dataset

    if tasks is None:
        from digirl_lite.envs.sim.env import SimPhoneEnv

        name = world if split == "train" else f"{world}_test"
        tasks = [t.text for t in SimPhoneEnv._load_task_list(name)]
        random.Random(seed).shuffle(tasks)
    tasks = list(tasks)[:n] if n else list(tasks)
    return Dataset.from_dict({
        "prompt": [[{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": f"Task: {t}"}] for t in tasks],
        "task": tasks, "seed": [10_000 * seed + k for k in range(len(tasks))]})
