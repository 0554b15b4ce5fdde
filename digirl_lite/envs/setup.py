"""The run's phones from its config: the simulated phone in this process, or devices over
Appium (already-running endpoints, or emulators this run starts), with their task lists.

    phones = make_phones(cfg, seed=cfg.seed)
    fleet = make_fleet(cfg.fleet, phones.make_env, phones.n, **cfg.fleet_options)
    ...
    phones.close()                     # stops the emulators this run started, if any

Everything a config can get wrong is a :class:`~digirl_lite.errors.ConfigError` naming the
field (or the device's URL) before anything is collected: unknown keys, a section that is
neither devices nor emulators, an endpoint that does not answer, a device without the
success check that ``{"judge": "env"}`` reads.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from digirl_lite.envs.base import SimOptions, WorldInfo
from digirl_lite.errors import ConfigError

__all__ = ["AndroidPlan", "Phones", "android_plan", "make_phones", "task_list",
           "split_path", "split_name", "split_task_list", "EndpointEnvFactory",
           "WORLD_HORIZON", "SimOptions", "sim_options", "WorldInfo", "world_info",
           "sim_demonstrations", "sim_copy_drills", "sim_extractor_pairs", "sim_env_kwargs"]

log = logging.getLogger("digirl_lite.envs")

WORLD_HORIZON = {"webshop": 20, "general": 10}
"""The paper's step budget H per task set."""
_RESETS = ("home", "task", "snapshot")


def world_info(cfg: Any) -> WorldInfo:
    """What the trainer needs of the run's world (``env``): its drift days' reset options,
    its entries in the pile's cache key and its screen features' width
    (:class:`~digirl_lite.envs.base.WorldInfo`), filled in by the world."""
    if cfg.env == "sim":
        from digirl_lite.envs.sim.info import world_info as sim_info

        return sim_info(cfg)
    from digirl_lite.envs.android.info import world_info as android_info

    return android_info(cfg)


@cache
def sim_options() -> SimOptions:
    """The simulated phone's :class:`SimOptions` (imports the simulator on first use)."""
    from digirl_lite.envs.sim.options import options

    return options()


def sim_demonstrations(world: str, *, surprises: dict[str, float] | None = None,
                       **kw: Any) -> tuple[Any, Any, Any]:
    """The scripted expert's demonstrations on the simulated phone, what the SFT copier
    learns from (:func:`digirl_lite.envs.sim.demos.generate_demos`: trajectories, their
    screens, stats); ``surprises``: surprise fields over the defaults (None: the defaults)."""
    from digirl_lite.envs.sim.demos import generate_demos
    from digirl_lite.envs.sim.world import Surprises

    if surprises is not None:
        kw["surprises"] = Surprises(**surprises)
    return generate_demos(world, **kw)


def sim_copy_drills(**kw: Any) -> Any:
    """Endless ``(prompt, text to type)`` copy drills on the simulator's train tasks
    (:func:`digirl_lite.envs.sim.drills.copy_drills`)."""
    from digirl_lite.envs.sim.drills import copy_drills

    return copy_drills(**kw)


def sim_extractor_pairs(world: str, share: float, phrasings: str, seed: int,
                        drills: int) -> list[tuple[str, str]]:
    """The span extractor's ``(task, typed text)`` pairs on the simulator's train tasks
    (:func:`digirl_lite.envs.sim.drills.extractor_pairs`)."""
    from digirl_lite.envs.sim.drills import extractor_pairs

    return extractor_pairs(world, share, phrasings, seed, drills)


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _checked(cls, d: Any, where: str) -> dict[str, Any]:
    """``d`` as keyword arguments of dataclass ``cls``, or a ConfigError naming ``where``."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a JSON object of {cls.__name__} fields, got "
                          f"{type(d).__name__}")
    unknown = sorted(set(d) - _fields(cls))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown} (the fields of {cls.__name__}: "
                          f"{sorted(_fields(cls))})")
    try:
        cls(**d)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None
    return dict(d)


@dataclass
class AndroidPlan:
    """The parsed ``android`` section: per-device :class:`AndroidConfig` keyword arguments
    (already-running endpoints), or an :class:`EmulatorConfig`'s (clones to start)."""

    devices: list[dict[str, Any]] = field(default_factory=list)
    emulators: dict[str, Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    reset: str = "home"
    setup: tuple[Any, ...] = ()
    """:class:`~digirl_lite.envs.lifecycle.DeviceCommand` s before every episode."""
    teardown: tuple[Any, ...] = ()
    """Commands after every episode that ended on the agent's account."""
    hard_reset: tuple[Any, ...] = ()
    """Commands of a hard reset on running devices (``hard_reset_every``)."""

    @property
    def n(self) -> int:
        return len(self.devices) if self.emulators is None else int(self.emulators.get("n", 1))


def android_plan(section: dict[str, Any]) -> AndroidPlan:
    """Parse and check the ``android`` config section (no device is contacted here)."""
    from digirl_lite.envs.android.device import AndroidConfig
    from digirl_lite.envs.android.emulator import EmulatorConfig
    from digirl_lite.envs.lifecycle import device_commands

    if not isinstance(section, dict):
        raise ConfigError("android: expected a JSON object")
    allowed = {"devices", "emulators", "options", "reset", "setup", "teardown", "hard_reset"}
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ConfigError(f"android: unknown keys {unknown} (one of {sorted(allowed)}: "
                          "'devices' lists running Appium endpoints, 'emulators' starts AVD "
                          "clones)")
    has_dev, has_emu = "devices" in section, "emulators" in section
    if has_dev == has_emu:
        raise ConfigError("android: give exactly one of 'devices' (a list of running Appium "
                          "endpoints: server_url, capabilities, ...) or 'emulators' (avd, n, "
                          "sdk_root: the run starts them)")
    options = _checked(AndroidConfig, section.get("options", {}), "android.options")
    reset = section.get("reset", "snapshot" if has_emu else "home")
    if reset not in _RESETS:
        raise ConfigError(f"android.reset: one of {_RESETS}, got {reset!r}")
    phases = {}
    for name in ("setup", "teardown", "hard_reset"):
        try:
            phases[name] = device_commands(section.get(name), f"android.{name}")
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if phases["hard_reset"] and has_emu:
        raise ConfigError("android.hard_reset: emulators hard-reset by loading their "
                          "snapshot; the commands are for running 'devices'")
    if has_dev:
        devs = section["devices"]
        if not isinstance(devs, list) or not devs:
            raise ConfigError("android.devices: a non-empty list of endpoints")
        if reset == "snapshot":
            raise ConfigError("android.reset: 'snapshot' needs 'emulators' (this run must "
                              "own the emulators it reloads)")
        devices = []
        for i, d in enumerate(devs):
            if isinstance(d, str):
                d = {"server_url": d}
            kw = _checked(AndroidConfig, {**options, **d}, f"android.devices[{i}]")
            if "server_url" not in d:
                raise ConfigError(f"android.devices[{i}]: no server_url")
            devices.append(kw)
        return AndroidPlan(devices=devices, options=options, reset=reset, **phases)
    emu = section["emulators"]
    if isinstance(emu, dict) and "avd" not in emu and not set(emu) - _fields(EmulatorConfig):
        raise ConfigError("android.emulators.avd: not set (the AVD to clone)")
    emu = _checked(EmulatorConfig, emu, "android.emulators")
    if reset == "task":
        raise ConfigError("android.reset: 'task' needs devices with their own task set-up "
                          "(served simulated phones); emulators reset by 'snapshot' or 'home'")
    return AndroidPlan(emulators=emu, options=options, reset=reset, **phases)


def task_list(cfg: Any, split: str) -> list[Any]:
    """The run's train or test tasks: ``task_file`` / ``test_task_file``, else the shipped
    list of ``world``. Parsed simulator :class:`~digirl_lite.envs.sim.Task` objects for the
    simulated phone; plain instructions for devices (a served simulated phone parses its
    own)."""
    from digirl_lite.paths import data_dir

    path = cfg.task_file if split == "train" else cfg.test_task_file
    path = Path(path).expanduser() if path else data_dir() / "tasks" / f"{cfg.world}_{split}.txt"
    tasks = _read_tasks(cfg, path, "task_file" if split == "train" else "test_task_file")
    if split == "train" and getattr(cfg, "phrasing_share", 0.0):
        from digirl_lite.envs.sim.phrasings import rephrase_train_tasks

        tasks = rephrase_train_tasks(tasks, cfg.phrasing_share, cfg.seed,
                                     getattr(cfg, "train_phrasings", "base"))
    return tasks


def train_goal_words(cfg: Any) -> frozenset[str]:
    """The words of the goals a run's policy trains on (config ``goal_unseen_words``): the
    run's train list, on the simulated phone also the shipped train list its starting policy
    is fine-tuned on and, where ``sft_phrasing_share`` or ``phrasing_share`` writes with
    them, the train phrasings' templates (:func:`~digirl_lite.policy.goal_features.
    goal_words`). No held-out list is read. Left out: the made-up products and names of
    the starting policy's demonstrations and copy drills (read through the features too, as
    any name the lists do not hold). Words are compared in lower case, so a known word in
    another case or quoted (which the tokenizer cuts otherwise) keeps its embeddings."""
    import re

    from digirl_lite.paths import data_dir
    from digirl_lite.policy.goal_features import goal_words

    texts = [getattr(t, "text", t) for t in task_list(cfg, "train")]
    if cfg.env == "sim":
        from digirl_lite.envs.sim.phrasings import train_phrasing_templates
        from digirl_lite.envs.sim.tasks import load_task_file

        texts += load_task_file(data_dir() / "tasks" / f"{cfg.world}_train.txt")
        if getattr(cfg, "phrasing_share", 0.0) or getattr(cfg, "sft_phrasing_share", 0.0):
            texts += [re.sub(r"\{\w*\}", " ", t) for t in train_phrasing_templates(
                cfg.world, getattr(cfg, "train_phrasings", "base"))]
    return frozenset(w for t in texts for _, _, w in goal_words(t))


def split_path(cfg: Any, name: str) -> Path:
    """The task file of the held-out split ``name`` of ``eval_splits``: a path (a name with
    "/" or ending ".txt"), else the shipped ``tasks/<world>_<name>.txt``."""
    from digirl_lite.paths import data_dir

    if "/" in name or name.endswith(".txt"):
        return Path(name).expanduser()
    return data_dir() / "tasks" / f"{cfg.world}_{name}.txt"


def split_name(cfg: Any, name: str) -> str:
    """What reports call the split ``name``: its file's name less ``.txt`` and the
    ``<world>_`` prefix (``unseen_products`` for ``webshop_unseen_products.txt``)."""
    return split_path(cfg, name).stem.removeprefix(f"{cfg.world}_")


def split_task_list(cfg: Any, name: str) -> list[Any]:
    """The tasks of the held-out split ``name`` of ``eval_splits`` (issue 32 item 5), parsed
    as :func:`task_list` parses the test list."""
    return _read_tasks(cfg, split_path(cfg, name), "eval_splits")


def _read_tasks(cfg: Any, path: Path, field: str) -> list[Any]:
    """The tasks of ``path`` for ``cfg.env``; a missing file or an empty list is a
    ConfigError naming ``field``."""
    if not path.is_file():
        raise ConfigError(f"{field}: no file {path}")
    if cfg.env == "sim":
        from digirl_lite.envs.sim.tasks import load_tasks

        tasks: list[Any] = load_tasks(path)
    else:
        from digirl_lite.envs.sim.tasks import load_task_file

        tasks = load_task_file(path)
    if not tasks:
        raise ConfigError(f"{field}: {path}: the task list is empty")
    return tasks


class EndpointEnvFactory:
    """A picklable ``slot -> AndroidEnv`` over a list of running endpoints (device ``slot``
    of the list), each with its own judge built from the judge config. Works in any fleet:
    threads, worker processes, Ray actors."""

    def __init__(self, devices: list[dict[str, Any]], judge: dict | None, horizon: int,
                 reset: str = "home", **lifecycle: Any) -> None:
        self.devices, self.judge, self.horizon, self.reset = devices, judge, horizon, reset
        self.lifecycle = lifecycle
        """AndroidEnv's setup, teardown, hard_reset_every and hard_reset (commands)."""

    def endpoint(self, slot: int) -> str | None:
        """Device ``slot``'s URL (what fleets name it by in their logs)."""
        return self.devices[slot].get("server_url")

    def __call__(self, slot: int = 0):
        from digirl_lite.envs.android.device import AndroidConfig
        from digirl_lite.envs.android.env import AndroidEnv
        from digirl_lite.envs.judges import make_judge

        return AndroidEnv(AndroidConfig(**self.devices[slot]), judge=make_judge(self.judge),
                          horizon=self.horizon, reset=self.reset, **self.lifecycle)


@dataclass
class Phones:
    """What a run collects on: ``make_env`` (slot -> env, picklable), ``n`` phones, the
    train and test task lists, and ``close`` for whatever this run started. ``down``: the
    slots of endpoints that could not be reached at the start (the fleet starts with them
    quarantined, and takes each in when a probe reaches it). ``splits``: the tasks of each
    held-out split of ``eval_splits``, by its :func:`split_name`."""

    make_env: Any
    n: int
    train_tasks: list[Any]
    test_tasks: list[Any]
    kind: str
    manager: Any = None
    down: tuple[int, ...] = ()
    splits: dict[str, list[Any]] = field(default_factory=dict)

    def close(self) -> None:
        if self.manager is not None:
            self.manager.stop()
            self.manager = None


def probe_device(kw: dict[str, Any], needs_check: bool) -> None:
    """Open a session on one endpoint, read its window size and, when the run needs the
    device's own task set-up or success check, its ``digirl: info``; ConfigError with the URL
    when it cannot."""
    from digirl_lite.envs.android.device import AndroidConfig, AppiumDevice, DeviceRefused

    conf = AndroidConfig(**{**kw, "connect_retries": 0})
    url = conf.server_url
    dev = None
    try:
        dev = AppiumDevice(conf, connect=False)
        dev.window_size()
        if needs_check:
            dev.execute("digirl: info")
    except DeviceRefused as e:
        raise ConfigError(
            f"android device {url}: it has no task set-up / success check ({e}); "
            "{\"judge\": \"env\"} and android.reset 'task' need served simulated phones "
            "(python -m digirl_lite.envs.sim.serve)") from None
    except Exception as e:  # DeviceUnavailable, or any failure to open a session
        raise ConfigError(f"android device {url} cannot be reached: "
                          f"{type(e).__name__}: {str(e)[:300]}") from None
    finally:
        if dev is not None:
            dev.quit()


def _unreachable(devices: list[dict[str, Any]], needs_check: bool) -> tuple[int, ...]:
    """Probe every endpoint; the slots of those that cannot be reached, each with one
    warning line (issue 29: the run goes on with the others). A device that answers but
    cannot serve the run (no task set-up or success check), or none reachable at all, is a
    ConfigError."""
    down, why = [], []
    for slot, kw in enumerate(devices):
        try:
            probe_device(kw, needs_check)
        except ConfigError as e:
            if "cannot be reached" not in str(e):
                raise
            down.append(slot)
            why.append(str(e))
    if len(down) == len(devices):
        raise ConfigError("; ".join(why))
    for w in why:
        log.warning("%s; the run starts without it and takes it in when a probe reaches it", w)
    return tuple(down)


def sim_env_kwargs(cfg: Any) -> dict[str, Any]:
    """The :class:`~digirl_lite.envs.sim.SimPhoneEnv` settings of a run's config beyond its
    tasks, judge and seed (``horizon``, ``hard_reset_every``, ``sim_surprises``,
    ``sim_faults``, ``ui_tree``, ``sim_layout``): what its phones are built with, and what a
    replay of its episodes needs (``cfg`` a config, or its ``summary.json`` dict)."""
    from digirl_lite.envs.sim import Surprises

    get = cfg.get if isinstance(cfg, dict) else lambda k, d=None: getattr(cfg, k, d)
    kw: dict[str, Any] = {"horizon": get("horizon")} if get("horizon") else {}
    if get("hard_reset_every") is not None:
        kw["hard_reset_every"] = get("hard_reset_every")
    if get("sim_surprises"):
        kw["surprises"] = {**dataclasses.asdict(Surprises()), **get("sim_surprises")}
    if get("sim_faults"):
        kw["faults"] = dict(get("sim_faults"))
    if get("ui_tree"):
        kw["ui_tree"] = True
    if get("sim_layout", "older") != "older":
        kw["layout"] = get("sim_layout")
    return kw


def make_phones(cfg: Any, seed: int, probe: bool = True) -> Phones:
    """The phones of ``cfg`` (``env``, ``android``, ``judge``, ``horizon``, task files):
    the simulated phone's factory, or Android devices; endpoints are probed (``probe``) and
    emulators started here, before any collection."""
    train, test = task_list(cfg, "train"), task_list(cfg, "test")
    splits = {split_name(cfg, s): split_task_list(cfg, s) for s in cfg.eval_splits}
    horizon = cfg.horizon or WORLD_HORIZON[cfg.world]
    if cfg.env == "sim":
        from digirl_lite.envs.sim import SimEnvFactory

        make = SimEnvFactory(judge=cfg.judge, seed=seed, tasks=cfg.task_file or cfg.world,
                             **sim_env_kwargs(cfg))
        return Phones(make, cfg.n_envs, train, test, "sim", splits=splits)
    plan = android_plan(cfg.android)
    if cfg.ui_tree:  # every device reads its page source
        plan = dataclasses.replace(plan, devices=[{**d, "ui_tree": True} for d in plan.devices],
                                   options={**plan.options, "ui_tree": True})
    needs_check = plan.reset == "task" or (cfg.judge or {}).get("judge") == "env"
    every = cfg.hard_reset_every or 0
    lifecycle: dict[str, Any] = {"setup": plan.setup, "teardown": plan.teardown}
    if plan.emulators is None:
        down = _unreachable(plan.devices, needs_check) if probe else ()
        if every:
            lifecycle.update(hard_reset_every=every, hard_reset=plan.hard_reset)
        make = EndpointEnvFactory(plan.devices, cfg.judge, horizon, plan.reset, **lifecycle)
        return Phones(make, plan.n, train, test, "android", down=down, splits=splits)
    from digirl_lite.envs.android.emulator import EmulatorConfig, EmulatorManager, SdkToolMissing

    if plan.reset == "snapshot" and cfg.fleet in ("process", "ray"):
        raise ConfigError(f"android.reset: 'snapshot' reloads emulators this process started, "
                          f"which fleet={cfg.fleet!r} workers cannot reach; use fleet 'sync' or "
                          "'async', or android.reset 'home'")
    try:
        manager = EmulatorManager(EmulatorConfig(**plan.emulators))
    except SdkToolMissing as e:
        raise ConfigError(f"android.emulators: {e}") from None
    manager.start()
    if plan.reset == "home" and not every:  # endpoints: picklable for workers and Ray actors
        devices = [{**dataclasses.asdict(manager.android_config(i)), **plan.options}
                   for i in range(plan.n)]
        make = EndpointEnvFactory(devices, cfg.judge, horizon, "home", **lifecycle)
    else:  # snapshot resets, or Home with a snapshot load every ``every`` episodes
        make = manager.env_factory(cfg.judge, horizon, minimal_reset=plan.reset == "home",
                                   hard_reset_every=every, setup=plan.setup,
                                   teardown=plan.teardown, **plan.options)
    return Phones(make, plan.n, train, test, "android", manager, splits=splits)
