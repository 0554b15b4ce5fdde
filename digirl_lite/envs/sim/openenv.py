"""The simulated phone as an OpenEnv environment (issue 31, item 2).

Serve it (one phone per WebSocket session, up to ``--max-sessions`` at once)::

    python -m digirl_lite.envs.sim.openenv --port 8000 [--host 127.0.0.1] [--world webshop]
        [--split train] [--task "Go to ebay.com"] [--seed 0] [--screen-size 456 216]
        [--ui-tree] [--horizon 20] [--day 1] [--judge '{"judge": "noisy_oracle"}']

and drive it from any OpenEnv client (``openenv-core``; ``pip install 'digirl-lite[openenv]'``)::

    from digirl_lite.actions import Action, format_action
    from digirl_lite.envs.sim.openenv import SimPhoneClient

    with SimPhoneClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(task="Go to ebay.com, search for 'logitech g910'", seed=0)
        print(result.observation.prompt)              # what the library's policies read
        result = env.step(format_action(Action.tap(x=0.5, y=0.3)))   # or a policy's text
        result = env.step({"action_type": "PRESS_HOME"})              # or structured
        print(result.reward, result.done, result.observation.success, env.state().step_count)

The environment is :class:`~digirl_lite.envs.sim.gym.SimPhoneGymEnv` (one per session) behind
OpenEnv's types, so the two speak alike: the same options, errors, observation conversions and
endings. **Action** (:class:`SimPhoneAction`): ``text`` in the library's action format
(:mod:`digirl_lite.actions`), or structured fields (``action_type``, ``touch_point``,
``lift_point`` as (y, x) in [0, 1], ``typed_text``) for agents that do not write text. One that
does not parse is an unparseable step, as everywhere in the library: reward 0, a no-op that
costs a step, ``invalid_reason`` says why; never an error. **Observation**
(:class:`SimPhoneObservation`): the goal, the policy's prompt, the step, the screenshot (PNG,
base64, at ``screen_size``), the UI tree as text (``ui_tree=True``), ``reward`` (the ground-truth
check, or a judge's verdict with ``judge=``), ``done``, and Gymnasium's ``terminated`` /
``truncated`` beside it with the ground truth: ``success``, ``invalid_reason``, ``truncation``
(``"budget"``, or ``"infra"`` for a simulated fault). **State** (:class:`SimPhoneState`): the
episode id, steps, world, task, day and the success so far.

**Reset options** (``env.reset(**options)``): ``seed``, ``episode_id``, ``task`` (this episode's
instruction), ``day`` (drift), ``screenshot`` (False: leave it out, for text-only agents), and
the server's own options for this episode (``world``, ``split``, ``tasks``, ``screen_size``,
``ui_tree``, ``max_nodes``, ``judge``, ``horizon``, ``surprises``, ``faults``); an option not
given takes the server's value. An unknown option, world or task is a clear error naming it
(the WebSocket client raises it, HTTP answers 400), and the session goes on as before.

OpenEnv 0.3.0's protocol, as this module relies on it: the WebSocket ``/ws`` holds a session
(its own environment) for reset/step/state, which is what :class:`SimPhoneClient` (and
``GenericEnvClient``) use; HTTP ``POST /reset`` and ``/step`` build a fresh environment per
request, so an HTTP ``/step`` has no episode (answered 409, saying so), and HTTP serves one-shot
resets, ``/schema``, ``/metadata`` and ``/health``. Observation ``metadata`` is not sent over the
wire (``serialize_observation`` drops it): the ground truth travels as fields, and the whole
step ``info`` as ``info``.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # `python .../openenv.py` would import itself
    raise SystemExit("run it as a module: python -m digirl_lite.envs.sim.openenv --port 8000")

import base64
import functools
import io
import json
import math
import uuid
from enum import Enum
from typing import Any

try:  # absolute imports: the real `openenv` package, never this module
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
    from pydantic import Field, model_validator
    from pydantic_core import PydanticCustomError
except ImportError as e:
    raise ImportError("digirl_lite.envs.sim.openenv needs openenv-core: pip install "
                      "'digirl-lite[openenv]' (or 'openenv-core>=0.3')") from e

import numpy as np

from digirl_lite.envs.sim.gym import SimPhoneGymEnv, structured_action_text

__all__ = ["SimPhoneAction", "SimPhoneObservation", "SimPhoneState", "SimPhoneEnvironment",
           "SimPhoneClient", "NoEpisodeError", "make_app", "main", "CONFIG_OPTIONS",
           "EPISODE_OPTIONS", "LocalServer"]

CONFIG_OPTIONS = ("world", "split", "task", "tasks", "seed", "screen_size", "ui_tree",
                  "max_nodes", "judge", "horizon", "day", "surprises", "faults")
"""The server's options (:class:`~digirl_lite.envs.sim.gym.SimPhoneGymEnv`'s, less its
Gymnasium-only ``action_space`` and ``render_mode``); a reset may give any of them for its
episode."""
EPISODE_OPTIONS = ("seed", "episode_id", "task", "day", "screenshot")
"""Reset options that belong to one episode (the others rebuild the session's phone when
they differ from the one it has)."""


class NoEpisodeError(RuntimeError):
    """A step with no episode running: before the first reset, after the episode ended, or
    over HTTP (each OpenEnv HTTP request gets a fresh environment)."""


# -- the typed models ---------------------------------------------------------------------
class SimPhoneAction(Action):
    """One action: ``text`` in the library's action format, or the structured fields.

    ``text`` may be anything a policy wrote (what does not parse is an unparseable step).
    Structured: ``action_type`` one of DUAL_POINT, TYPE, PRESS_BACK, PRESS_HOME, PRESS_ENTER,
    STATUS_TASK_COMPLETE, TASK_IMPOSSIBLE; ``touch_point`` / ``lift_point`` (y, x) in [0, 1]
    for DUAL_POINT; ``typed_text`` for TYPE (one that is not an action is an unparseable
    step too). Giving both ``text`` and ``action_type`` is a malformed request.
    """

    text: str | None = Field(default=None, description="the action in the library's action "
                             "format, e.g. 'Action Type: PRESS_HOME, ...' (digirl_lite.actions)")
    action_type: str | None = Field(default=None, description="structured: the action type")
    touch_point: tuple[float, float] | None = Field(
        default=None, description="structured DUAL_POINT: touch (y, x) in [0, 1]")
    lift_point: tuple[float, float] | None = Field(
        default=None, description="structured DUAL_POINT: lift (y, x) in [0, 1]")
    typed_text: str | None = Field(default=None, description="structured TYPE: the text")

    @model_validator(mode="after")
    def _text_or_structured(self) -> SimPhoneAction:
        if self.text is not None and self.action_type is not None:
            # not a ValueError: OpenEnv 0.3.0 puts the exception object of a ValueError in its
            # error reply, which then fails to serialise (HTTP 500, the WebSocket dropped)
            raise PydanticCustomError("text_and_action_type",
                                      "an action has either text or action_type, not both")
        return self

    def action_text(self) -> str:
        """The action-format string this action stands for (one that does not parse, saying
        why, when it is not an action; ``""`` when it is empty)."""
        if self.action_type is None:
            return self.text or ""
        return structured_action_text({"action_type": self.action_type,
                                       "touch_point": self.touch_point,
                                       "lift_point": self.lift_point,
                                       "typed_text": self.typed_text or ""})


class SimPhoneObservation(Observation):
    """What the phone shows after a reset or a step (plus OpenEnv's ``reward``, ``done`` and
    ``metadata``: the ground truth's three fields, which OpenEnv does not send, so
    :class:`SimPhoneClient` fills them in again from the fields)."""

    goal: str = Field(default="", description="the instruction")
    prompt: str = Field(default="", description="what the library's policies read: "
                        "'Previous Actions: ... Goal: ...'")
    step: int = Field(default=0, ge=0, description="steps taken in this episode")
    screenshot: str | None = Field(default=None, description="the screen as a base64 PNG, "
                                   "screen_size (height, width); None with screenshot=False")
    screen_size: tuple[int, int] = Field(default=(456, 216), description="(height, width)")
    ui_tree: str | None = Field(default=None, description="one line per node an agent can act "
                                "on (with ui_tree=True)")
    terminated: bool = Field(default=False, description="Gymnasium's: the task is done (by the "
                             "reward's judge) or the agent declared it over")
    truncated: bool = Field(default=False, description="Gymnasium's: the step budget ran out, "
                            "or the phone failed")
    success: bool = Field(default=False, description="the ground truth: the task is done")
    invalid_reason: str | None = Field(default=None, description="why the action did not parse")
    truncation: str | None = Field(default=None, description="'budget' or 'infra' (a fault)")
    action: str | None = Field(default=None, description="the action as parsed (None: "
                               "unparseable)")
    info: dict[str, Any] = Field(default_factory=dict, description="the step's whole info "
                                 "(as SimPhoneGymEnv's)")

    def image(self):
        """The screenshot as a PIL image (None when left out)."""
        if self.screenshot is None:
            return None
        from PIL import Image

        return Image.open(io.BytesIO(base64.b64decode(self.screenshot))).convert("RGB")

    def screenshot_array(self) -> np.ndarray | None:
        """The screenshot as uint8 (height, width, 3), as the Gymnasium env's (None when left
        out)."""
        im = self.image()
        return None if im is None else np.asarray(im, dtype=np.uint8)


class SimPhoneState(State):
    """The session's episode (``episode_id`` and ``step_count`` from OpenEnv's
    :class:`State`)."""

    world: str = Field(default="webshop", description="'webshop' or 'general'")
    split: str = Field(default="train", description="the instruction list tasks come from")
    task: str | None = Field(default=None, description="this episode's instruction")
    day: int = Field(default=1, description="the drift day")
    horizon: int | None = Field(default=None, description="this episode's step budget H")
    success: bool = Field(default=False, description="the ground truth so far")
    done: bool = Field(default=False, description="the episode has ended")
    total_reward: float = Field(default=0.0, description="the rewards summed so far")


# -- the environment ----------------------------------------------------------------------
def _png(frame: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, Enum):
        return _jsonable(value.value)
    return str(value)


def _check_config(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(CONFIG_OPTIONS))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for digirl_lite's SimPhone over OpenEnv "
                         f"(its options: {', '.join(CONFIG_OPTIONS)}; at reset also "
                         f"{', '.join(o for o in EPISODE_OPTIONS if o not in CONFIG_OPTIONS)})")


def _config(options: dict[str, Any]) -> dict[str, Any]:
    """The phone's options as compared between resets (None: SimPhoneGymEnv's default)."""
    return {k: v for k, v in options.items() if v is not None}


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)  # (456, 216) == [456, 216]


class SimPhoneEnvironment(Environment[SimPhoneAction, SimPhoneObservation, SimPhoneState]):
    """The simulated phone as an OpenEnv :class:`Environment`: a
    :class:`~digirl_lite.envs.sim.gym.SimPhoneGymEnv` behind OpenEnv's reset/step/state.

    Args:
        screenshot: put the screenshot in observations (False: text-only agents, faster).
        **options: the server's options, :data:`CONFIG_OPTIONS` (``world``, ``split``,
            ``task``, ``tasks``, ``seed``, ``screen_size``, ``ui_tree``, ``max_nodes``,
            ``judge``, ``horizon``, ``day``, ``surprises``, ``faults``: as
            :class:`~digirl_lite.envs.sim.gym.SimPhoneGymEnv` takes them). An unknown one, or a
            bad value, raises ValueError naming it.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own phone

    def __init__(self, screenshot: bool = True, **options: Any) -> None:
        super().__init__()
        _check_config(options)
        self.screenshot = self._screenshot_now = bool(screenshot)
        self._base = _config({k: v for k, v in options.items() if k != "seed"})
        self._config = self._base
        self._first_seed = options.get("seed")  # the session's first reset's, when it has none
        self.env = SimPhoneGymEnv(**self._config)  # refuses a bad world, task, ... by name
        self._state = SimPhoneState(**self._state_fields(None))
        self._live = False

    def _state_fields(self, task: str | None) -> dict[str, Any]:
        return {"world": self.env.world, "split": self.env.split, "task": task,
                "day": self.env.sim.day,
                "horizon": self.env.sim.horizon if task is not None else None}

    # -- the API --------------------------------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **options: Any) -> SimPhoneObservation:
        """Start an episode; ``options`` as the module's docstring says (seed: an int >= 0,
        the session's first reset taking the server's seed when not given).

        Raises:
            ValueError: an unknown option, world or task, or a bad value (naming it); the
                session keeps the phone it had, with no episode running.
        """
        self._live = False
        given = sorted(options)
        screenshot = options.pop("screenshot", self.screenshot)
        if not isinstance(screenshot, bool):
            raise ValueError(f"reset option screenshot must be true or false, got {screenshot!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"reset option seed must be an int >= 0, got {seed!r}")
        if episode_id is not None and not isinstance(episode_id, str):
            raise ValueError(f"reset option episode_id must be a string, got {episode_id!r}")
        task = options.pop("task", None)  # None: the server's task, or one drawn
        if task is not None and not isinstance(task, str):
            raise ValueError(f"reset option task must be an instruction (a string), got {task!r}")
        day = options.pop("day", self._base.get("day", 1))
        _check_config(options)  # what is left: the phone's options for this episode
        config = _config({**self._base, **options})
        if seed is None and self._first_seed is not None:
            seed = self._first_seed
        env = self.env
        try:  # a new phone when the options differ; kept only if it resets
            if _key(config) != _key(self._config):
                env = SimPhoneGymEnv(**config)  # refuses a bad world, split, ... by name
            reset_options = {"day": day} if task is None else {"day": day, "task": task}
            obs, info = env.reset(seed=seed, options=reset_options)
        except Exception as e:
            if env is not self.env:
                env.close()
            if isinstance(e, (TypeError, AttributeError, KeyError)):  # a wrong type (JSON)
                raise ValueError(f"digirl_lite/SimPhone reset options {given} refused: "
                                 f"{type(e).__name__}: {e}") from e
            raise
        if env is not self.env:
            self.env.close()
            self.env, self._config = env, config
        self._first_seed = None
        self._screenshot_now = screenshot
        self._live = True
        self._state = SimPhoneState(episode_id=episode_id or uuid.uuid4().hex, step_count=0,
                                    success=bool(info.get("success", False)),
                                    **self._state_fields(info.get("task")))
        return self._observation(obs, None, False, False, info)

    def step(self, action: SimPhoneAction | str, timeout_s: float | None = None,
             **kwargs: Any) -> SimPhoneObservation:
        """One action (a :class:`SimPhoneAction`, or its text). An action that does not
        parse is an unparseable step (reward 0, the episode goes on).

        Raises:
            NoEpisodeError: no episode is running (reset first; over HTTP, use the WebSocket
                session: each HTTP request gets a fresh environment).
        """
        if not self._live:
            raise NoEpisodeError(
                "no episode is running: reset() first (the last one ended, or none started); "
                "over HTTP every request gets a fresh environment, so step over the WebSocket "
                "session (/ws), as OpenEnv's EnvClient does")
        text = action if isinstance(action, str) else action.action_text()
        obs, reward, terminated, truncated, info = self.env.step(text)
        if info.get("invalid_reason") and not isinstance(action, str) \
                and action.action_type is not None:
            info["invalid_reason"] = text  # the structured action's own reason, not the parse's
        self._live = not (terminated or truncated)
        s = self._state
        s.step_count += 1
        s.success = bool(info.get("success", s.success))
        s.done = not self._live
        s.total_reward += float(reward)
        return self._observation(obs, float(reward), terminated, truncated, info)

    @property
    def state(self) -> SimPhoneState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="digirl_lite SimPhone",
            description="A simulated Android phone (launcher, Chrome, Google, six shops, "
                        "pop-ups, voice input, drift) with a ground-truth check: Web Shopping "
                        "and General tasks from the DigiRL paper, actions in the AutoUI format.",
            version=_version())

    def close(self) -> None:
        self._live = False
        self.env.close()

    # -- the conversion -------------------------------------------------------------------
    def _observation(self, obs: dict[str, Any], reward: float | None, terminated: bool,
                     truncated: bool, info: dict[str, Any]) -> SimPhoneObservation:
        info = _jsonable(info)
        truth = {"success": bool(info.get("success", False)),
                 "invalid_reason": info.get("invalid_reason"),
                 "truncation": info.get("truncation")}
        return SimPhoneObservation(
            goal=obs["goal"], prompt=obs["prompt"], step=int(obs["step"]),
            screenshot=_png(obs["screenshot"]) if self._screenshot_now else None,
            screen_size=tuple(self.env.screen_size), ui_tree=obs.get("ui_tree"),
            reward=reward, done=bool(terminated or truncated), terminated=bool(terminated),
            truncated=bool(truncated), action=info.get("action"), info=info,
            metadata=dict(truth), **truth)


def _version() -> str:
    from digirl_lite import __version__

    return __version__


# -- the client ---------------------------------------------------------------------------
class SimPhoneClient(EnvClient[SimPhoneAction, SimPhoneObservation, SimPhoneState]):
    """A typed OpenEnv client for the served phone (one WebSocket session, its own phone).

    OpenEnv's clients are async; ``.sync()`` gives the blocking one::

        with SimPhoneClient(base_url="http://127.0.0.1:8000").sync() as env:
            result = env.reset(task="Go to ebay.com", seed=0)   # StepResult
            result = env.step(action_text)    # a string, a SimPhoneAction or its dict
            result.observation.success, result.reward, result.done, env.state().step_count

    A server-side error (an unknown option, world or task; a step with no episode) raises
    RuntimeError with the server's message; the session stays usable.
    """

    def _step_payload(self, action: SimPhoneAction | str | dict[str, Any]) -> dict[str, Any]:
        if isinstance(action, str):
            action = SimPhoneAction(text=action)
        elif isinstance(action, dict):
            action = SimPhoneAction(**action)
        return action.model_dump(exclude_none=True, exclude_defaults=True) or {"text": ""}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[SimPhoneObservation]:
        fields = SimPhoneObservation.model_fields
        data = {k: v for k, v in payload.get("observation", {}).items() if k in fields}
        obs = SimPhoneObservation(**data, reward=payload.get("reward"),
                                  done=bool(payload.get("done", False)))
        obs.metadata = {k: getattr(obs, k) for k in ("success", "invalid_reason", "truncation")}
        return StepResult(observation=obs, reward=payload.get("reward"),
                          done=bool(payload.get("done", False)))

    def _parse_state(self, payload: dict[str, Any]) -> SimPhoneState:
        return SimPhoneState(**payload)


# -- the server ---------------------------------------------------------------------------
def make_app(max_sessions: int = 8, screenshot: bool = True, **options: Any):
    """The FastAPI app serving the phone (OpenEnv's ``create_app``; with
    ``ENABLE_WEB_INTERFACE=true`` OpenEnv adds its web UI at ``/web``).

    Args:
        max_sessions: WebSocket sessions (phones) at once; each holds a phone with its screen
            cache (~60 MB at most). A client over the limit gets OpenEnv's CAPACITY_REACHED.
        screenshot: observations carry the screenshot unless a reset says otherwise.
        **options: the phone's, :data:`CONFIG_OPTIONS`; checked here (ValueError naming a bad
            one) so that a server never starts with options no session could use.

    ``uvicorn --factory digirl_lite.envs.sim.openenv:make_app`` serves the defaults.
    """
    from fastapi import Request
    from fastapi.responses import JSONResponse

    SimPhoneEnvironment(screenshot=screenshot, **options).close()
    app = create_app(functools.partial(SimPhoneEnvironment, screenshot=screenshot, **options),
                     SimPhoneAction, SimPhoneObservation, env_name="digirl_lite_simphone",
                     max_concurrent_envs=max_sessions)

    # OpenEnv answers an exception from the environment with a bare 500 over HTTP: say what
    # was wrong instead (over the WebSocket it already sends the message)
    async def bad_option(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(exc)})

    async def no_episode(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    app.add_exception_handler(ValueError, bad_option)
    app.add_exception_handler(NoEpisodeError, no_episode)
    app.add_middleware(_QuietClose)
    return app


class _QuietClose:
    """OpenEnv 0.3.0 closes each session's WebSocket after its client has (a client's
    ``close()`` sends "close" and hangs up), and the refused close escapes as an ASGI error:
    a traceback in the log at every normal disconnect. The session is already gone then."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass


class LocalServer:
    """``python -m digirl_lite.envs.sim.openenv`` started as a child process on 127.0.0.1 (a
    free port unless given), ready when ``/health`` answers; stopped (this process only, by
    its pid) on :meth:`stop` or at the end of a ``with`` block, and on Linux when this
    process dies, however it dies. ``args``: the command's own
    (``["--ui-tree", "--no-screenshot"]`` ...).

        with LocalServer(["--ui-tree"]) as server:
            env = SimPhoneClient(base_url=server.url).sync()
    """

    def __init__(self, args: list[str] | None = None, port: int | None = None,
                 log: str | None = None, start_timeout_s: float = 120.0) -> None:
        import os
        import subprocess
        import sys
        import tempfile
        import time

        import requests

        from digirl_lite.envs.sim.serve.processes import ends_with_parent

        if port is None:
            import socket

            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log or tempfile.mkstemp(prefix="digirl_openenv_", suffix=".log")[1]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "digirl_lite.envs.sim.openenv", "--host", "127.0.0.1",
                 "--port", str(port), *(args or [])], stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
                preexec_fn=ends_with_parent())  # a killed trainer leaves no server behind
        deadline = time.monotonic() + start_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the OpenEnv server exited ({self.proc.returncode}): "
                                   f"{self.tail()}")
            try:
                if requests.get(f"{self.url}/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the OpenEnv server did not answer in {start_timeout_s} s: "
                                   f"{self.tail()}")
            time.sleep(0.25)

    def tail(self, chars: int = 3000) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()[-chars:]

    def alive(self) -> bool:
        import requests

        return self.proc.poll() is None and requests.get(f"{self.url}/health", timeout=5).ok

    def stop(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """``python -m digirl_lite.envs.sim.openenv --port P``: serve the phone with uvicorn."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m digirl_lite.envs.sim.openenv",
                                description="Serve digirl_lite's simulated phone as an "
                                            "OpenEnv environment.")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1",
                   help="the interface to listen on (0.0.0.0: every one)")
    p.add_argument("--world", default="webshop", help="webshop or general")
    p.add_argument("--split", default="train", help="train or test: the instructions drawn")
    p.add_argument("--task", default=None, help="one instruction for every episode")
    p.add_argument("--seed", type=int, default=None, help="each session's first reset's seed")
    p.add_argument("--screen-size", type=int, nargs=2, default=(456, 216),
                   metavar=("HEIGHT", "WIDTH"))
    p.add_argument("--ui-tree", action="store_true", help="add the UI tree text")
    p.add_argument("--no-screenshot", action="store_true",
                   help="leave the screenshot out of observations (text-only agents)")
    p.add_argument("--horizon", type=int, default=None, help="the step budget H")
    p.add_argument("--day", type=int, default=1, help="the drift day")
    p.add_argument("--judge", type=json.loads, default=None,
                   help='a judge config as JSON, e.g. \'{"judge": "noisy_oracle"}\'')
    p.add_argument("--max-sessions", type=int, default=8)
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    options = {"world": args.world, "split": args.split, "task": args.task, "seed": args.seed,
               "screen_size": tuple(args.screen_size), "ui_tree": args.ui_tree,
               "horizon": args.horizon, "day": args.day, "judge": args.judge}
    try:
        app = make_app(max_sessions=args.max_sessions, screenshot=not args.no_screenshot,
                       **options)
    except ValueError as e:
        p.error(str(e))
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
