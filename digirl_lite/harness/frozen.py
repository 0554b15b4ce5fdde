"""What a frozen agent's runs share (DarwinX's :mod:`~digirl_lite.harness.evolve` and
Darwin-Claw's :mod:`~digirl_lite.harness.claw.run`): where the frozen policy acts (today's
phone, or another training run's ``setting``), its agents with and without the grammar
mask, the held-out sets (the test list, the unseen splits, each task's kind) and a stage's
held-out measurement on common random numbers; the config dataclasses' dict round trip and
their command line.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from digirl_lite.errors import ConfigError

__all__ = ["RunFields", "frozen_setting", "check_frozen_setting", "command_line_fields",
           "as_tuple", "run_folder", "split_file", "agent_factory", "held_out_sets", "measure",
           "task_kind"]


class RunFields:
    """A frozen-agent run's config dataclass: its field names, built from a dict (an
    unknown field is a ConfigError listing the known ones) and written back as one."""

    @classmethod
    def fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        unknown = sorted(set(d) - set(cls.fields()))
        if unknown:
            raise ConfigError(f"unknown field(s) {unknown}; known: {cls.fields()}")
        return cls(**d)


def frozen_setting(world: str, setting: str | None, env: dict[str, Any],
                   starting_policy: str | None, copy_typed_text: bool
                   ) -> tuple[dict[str, Any], Path, bool]:
    """Where a frozen policy acts: the phones' SimPhoneEnv fields, the policy's directory and
    its copy mask. From ``setting`` (a training run's config file: its live phone, its
    shipped starting policy for ``world``, its ``copy_typed_text``) where it is given, else
    ``env``, ``starting_policy`` (None: the shipped one of ``world``) and
    ``copy_typed_text``. Shared by DarwinX (:class:`EvolveConfig`) and Darwin-Claw's runs
    (:class:`~digirl_lite.harness.claw.run.ClawRunConfig`).

    Raises:
        ConfigError: a setting file that does not load, or one not on the simulated phone
            (naming ``setting``)."""
    from digirl_lite.paths import data_dir

    if setting is None:
        path = (Path(starting_policy).expanduser() if starting_policy else
                data_dir() / "policies" / f"sft-{world}")
        return dict(env), path, bool(copy_typed_text)
    from digirl_lite.envs.setup import sim_env_kwargs
    from digirl_lite.train.config import load_config
    from digirl_lite.train.starting import shipped_policy_dir

    try:
        run = load_config(setting, world=world)
    except (OSError, ValueError) as e:
        raise ConfigError(f"setting: {setting}: {e}") from e
    if run.env != "sim":
        raise ConfigError(f"setting: {setting} is a run on env {run.env!r}; a frozen agent "
                          "here acts on the simulated phone")
    return (sim_env_kwargs(run), shipped_policy_dir(run),
            bool(run.copy_typed_text or copy_typed_text))


def check_frozen_setting(cfg: Any) -> None:
    """The setting fields of a frozen-agent run's config (``setting``, ``env``,
    ``starting_policy``, ``copy_typed_text``, ``eval_splits``), as ConfigErrors naming the
    field."""
    def bad(name: str, why: str) -> None:
        raise ConfigError(f"{name}: {why}")

    if not isinstance(cfg.copy_typed_text, bool):
        bad("copy_typed_text", f"must be true or false, got {cfg.copy_typed_text!r}")
    if "privileged_state" in cfg.env:
        bad("env", "privileged_state follows the teacher (on for 'privileged_expert' "
            "only); do not set it")
    if cfg.starting_policy is not None and not Path(cfg.starting_policy).expanduser() \
            .is_dir():
        bad("starting_policy", f"{cfg.starting_policy!r} is not a directory")
    if cfg.setting is not None:
        if cfg.env or cfg.starting_policy is not None or getattr(cfg, "agent",
                                                                 "policy") != "policy":
            bad("setting", "a setting gives the phones, the frozen policy and its copy "
                "mask: not with env, starting_policy or a prompted agent")
        _, policy, _ = cfg.resolved()
        if not policy.is_dir():
            bad("setting", f"{cfg.setting}: no shipped starting policy for {cfg.world} at "
                f"{policy} (build it with python recipes/make_starting_policy.py --config "
                f"{cfg.setting} --world {cfg.world})")
    if not isinstance(cfg.eval_splits, tuple) or not all(
            isinstance(x, str) and x for x in cfg.eval_splits):
        bad("eval_splits", f"must be a list of split names or task files, got "
            f"{cfg.eval_splits!r}")
    for x in cfg.eval_splits:
        if not split_file(cfg.world, x).is_file():
            bad("eval_splits", f"no split {x!r} on {cfg.world} (no file "
                f"{split_file(cfg.world, x)})")


def command_line_fields(args: Any, quick: dict[str, Any]) -> dict[str, Any]:
    """A frozen-agent recipe's config fields from its command line: ``--config`` (a JSON
    file; keys starting with "_" are comments), ``quick`` where ``--quick``, ``--world``,
    ``--seed``, then each ``--set FIELD=JSON`` (a value that is not JSON is a string).

    Raises:
        ConfigError: a ``--set`` without "="."""
    d: dict[str, Any] = {}
    if args.config:
        d.update({k: v for k, v in json.loads(Path(args.config).read_text()).items()
                  if not k.startswith("_")})
    if args.quick:
        d.update(quick)
    if args.world:
        d["world"] = args.world
    if args.seed is not None:
        d["seed"] = args.seed
    for item in args.set:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: give FIELD=JSON")
        k, v = item.split("=", 1)
        try:
            d[k] = json.loads(v)
        except json.JSONDecodeError:
            d[k] = v  # a bare string
    return d


def as_tuple(value: Any) -> Any:
    """A config list field as a tuple: a JSON list, or a bare comma list from ``--set``."""
    if isinstance(value, str):
        return tuple(k.strip() for k in value.split(",") if k.strip())
    return tuple(value) if isinstance(value, list) else value


@contextmanager
def run_folder(out: str | Path, resume: bool) -> Iterator[Path]:
    """A frozen-agent run's folder, held by its lock while the run goes (a second process on
    it is refused); a folder with anything in it only with ``resume``.

    Raises:
        ConfigError: ``out`` not empty without ``resume``."""
    from digirl_lite.paths import lock_run_folder

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not resume:
        raise ConfigError(f"--out {out} is not empty: pass --resume to continue the run there "
                          "or choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    lock = lock_run_folder(out)
    try:
        yield out
    finally:
        lock.release()


def split_file(world: str, name: str) -> Path:
    """The task file of the held-out split ``name`` (the Trainer's ``eval_splits`` rule,
    :func:`digirl_lite.envs.setup.split_path`)."""
    from types import SimpleNamespace

    from digirl_lite.envs.setup import split_path

    return split_path(SimpleNamespace(world=world), name)


def agent_factory(cfg: Any):
    """``(components, screens) -> HarnessAgent`` and the constrained-decoding baseline."""
    from digirl_lite.harness.harness import HarnessAgent, PolicyAgent

    if getattr(cfg, "agent", "policy") == "prompted":
        from digirl_lite.harness.llm import PromptedAgent

        agent = PromptedAgent(dict(cfg.agent_backend))

        def make(components, screens):
            return HarnessAgent(components, agent)
        return make, None, None
    from digirl_lite.policy.factory import load_policy
    from digirl_lite.vision import FeatureCache, SimScreenEncoder

    _, path, copy = cfg.resolved()
    policy = load_policy(path)
    features = FeatureCache(SimScreenEncoder(dim=policy.img_dim, seed=0))

    def make(components, screens):
        return HarnessAgent(components, PolicyAgent(policy, features, screens,
                                                    cfg.temperature, copy_text=copy))

    def make_constrained(components, screens):
        return HarnessAgent(components, PolicyAgent(policy, features, screens,
                                                    cfg.temperature, constrained=True,
                                                    copy_text=copy))
    return make, make_constrained, str(path)


def held_out_sets(cfg: Any) -> tuple[list[str], dict[str, list[Any]], dict[str, str]]:
    """A frozen-agent run's held-out tasks: the first ``eval_tasks`` of the world's test
    list (texts), the first ``eval_split_tasks`` of each of ``eval_splits`` by split name,
    and every one's kind (:func:`task_kind`) by its text."""
    from digirl_lite.envs.setup import split_name
    from digirl_lite.envs.sim.env import SimPhoneEnv
    from digirl_lite.envs.sim.tasks import load_tasks

    test = SimPhoneEnv._load_task_list(f"{cfg.world}_test")
    splits = {split_name(cfg, x): load_tasks(split_file(cfg.world, x))[:cfg.eval_split_tasks]
              for x in cfg.eval_splits}
    kinds = {t.text: task_kind(t) for t in [*test, *(t for ts in splits.values()
                                                     for t in ts)]}
    return [t.text for t in test][:cfg.eval_tasks], splits, kinds


def measure(fleet: Any, maker: Any, components: dict[str, str], held: list[str],
            splits: dict[str, list[Any]], kinds: dict[str, str], seed: int
            ) -> dict[str, Any]:
    """One stage's held-out report: pass@1 on ``held`` at env seeds ``10_000 + 1000 *
    seed + k``, each split under ``splits`` on seeds of its own (the same at every stage,
    so that stages pair task by task and noise by noise)."""
    rep = held_out(fleet, maker, components, held, 10_000 + 1000 * seed, kinds)
    if splits:
        rep["splits"] = {sp: held_out(fleet, maker, components, tasks,
                                       10_000 + 1000 * seed + 100 * (k + 1), kinds)
                         for k, (sp, tasks) in enumerate(splits.items())}
    return rep


def task_kind(task: Any) -> str:
    """A task's kind for the per-kind shares: General's ``search`` / ``open_app``, Web
    Shopping's level (``webshop level 1``: go to the site, 2: search, 3: add to cart)."""
    return f"{task.kind} level {task.level}" if task.level else task.kind


def held_out(fleet, make, components, tasks, seed: int,
             kinds: dict[str, str] | None = None) -> dict[str, Any]:
    """pass@1 on ``tasks``: summarize()'s record plus who decided the steps (in all, and per
    task kind where ``kinds`` maps each task's text to its kind)."""
    import torch

    from digirl_lite.data.records import ScreenTable
    from digirl_lite.harness.harness import decision_shares
    from digirl_lite.train.evaluate import evaluate

    screens = ScreenTable()
    torch.manual_seed(seed)
    agent = make(components, screens)
    agent.crn_salt = seed  # every stage draws the same noise where it sees the same screen
    summary, episodes = evaluate(fleet, agent, tasks, seed=seed, screens=screens, n_tasks=None)
    summary["decided"] = decision_shares([e.trajectory for e in episodes])
    if kinds:
        by: dict[str, list[Any]] = {}
        for e in episodes:
            by.setdefault(kinds.get(e.trajectory.task, "other"), []).append(e.trajectory)
        summary["decided_by_kind"] = {k: {**decision_shares(ts), "episodes": len(ts),
                                          "successes": sum(bool(t.is_success) for t in ts)}
                                      for k, ts in sorted(by.items())}
    summary["per_task"] = {e.trajectory.task: (None if not e.trajectory.is_usable
                                                else bool(e.trajectory.is_success))
                           for e in episodes}
    return summary
