"""Collection: the policy behind the fleet (:class:`~digirl_lite.policy.agent.PolicyBatchAgent`,
imported here for the trainer), the run's fleets, and :meth:`Collection._collect`, which
every phase collects through (the pile, the synchronous online iterations, the
evaluations): each process its share of the tasks, the episodes exchanged under
``accelerate launch`` (:meth:`Collection._exchange`), unjudged steps counted, and a
collection that cannot go on kept aside before :class:`RunStopped`.

A mixin of :class:`~digirl_lite.train.trainer.Trainer`: it reads the Trainer's ``cfg``,
``phones``, ``features``, ``screens``, ``rank`` and ``world_size``. The asynchronous
learner's background collection is in :mod:`digirl_lite.train.async_collection`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from digirl_lite import distributed as dist
from digirl_lite.data.records import ScreenTable, Trajectory
from digirl_lite.data.store import TrajectoryStore
from digirl_lite.envs.base import Observation
from digirl_lite.paths import atomic_write_text
from digirl_lite.policy.agent import PolicyBatchAgent
from digirl_lite.redaction import redact
from digirl_lite.rollout.fleet import JudgeUnavailable, NoDevicesLeft

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.train.trainer import Trainer

__all__ = ["PolicyBatchAgent", "RunStopped", "FLEET_FILE", "merge_fleet_stats", "Collection"]


FLEET_FILE = "fleet.json"


def merge_fleet_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two :meth:`FleetStats.as_dict` records as one: counts added (per cause for
    ``infra_truncations``), ``device_events`` one after the other."""
    out = dict(a)
    for k, v in b.items():
        if k not in out:
            out[k] = v
        elif isinstance(v, dict):
            out[k] = {c: out[k].get(c, 0) + v.get(c, 0) for c in {**out[k], **v}}
        elif isinstance(v, list):
            out[k] = list(out[k]) + list(v)
        else:
            out[k] = out[k] + v
    return out


class RunStopped(RuntimeError):
    """The run stopped on purpose (its judge could not answer, or no device was left): what
    the stopped phase had finished is kept in ``stopped/``; ``--resume`` redoes that phase
    from the last checkpoint (saved at its start) once the cause is fixed."""


class _StageFleet:
    """The Trainer's fleet as :func:`evaluate` sees it: ``collect`` through
    :meth:`Trainer._collect`, so evaluations count and stop on unjudged steps too."""

    def __init__(self, trainer: Trainer, stage: str) -> None:
        self.trainer, self.stage = trainer, stage

    def collect(self, agent, tasks, screens, **kw):
        return self.trainer._collect(self.stage, agent, tasks, screens,
                                     fleet=self.trainer.eval_fleet(), **kw)


class Collection:
    """The Trainer's fleets and its synchronous collection (mixed into
    :class:`~digirl_lite.train.trainer.Trainer`)."""

    def fleet(self):
        if self._fleet is None:
            from digirl_lite.rollout import make_fleet

            self._fleet = make_fleet(self.cfg.fleet, self.phones.make_env, self.phones.n,
                                     **self._fleet_options())
        return self._fleet

    def _fleet_options(self) -> dict[str, Any]:
        c = self.cfg
        opts = {"max_unjudged_steps": c.max_unjudged_steps,
                "max_unjudged_s": c.max_unjudged_s,
                "max_task_attempts": c.max_task_attempts,
                "quarantine_after": c.quarantine_after,
                "quarantine_probe_s": c.quarantine_probe_s, **c.fleet_options}
        if self.phones.down:  # endpoints unreachable at the start: in when they answer
            opts["quarantined"] = self.phones.down
        return opts

    def eval_fleet(self):
        """The evaluations' fleet: :meth:`fleet` itself, or with ``eval_judge`` a fleet of
        simulated phones like the run's (same seeds, tasks, surprises) judged by it."""
        if self.cfg.eval_judge is None:
            return self.fleet()
        if self._eval_fleet is None:
            from digirl_lite.envs.setup import make_phones
            from digirl_lite.rollout import make_fleet

            cfg = dataclasses.replace(self.cfg, judge=self.cfg.eval_judge, eval_judge=None)
            phones = make_phones(cfg, seed=self.cfg.seed + 7919 * self.rank, probe=False)
            self._eval_fleet = make_fleet(self.cfg.fleet, phones.make_env, phones.n,
                                          **self._fleet_options())
        return self._eval_fleet

    def _save_fleet_stats(self) -> None:
        """``fleet.json``: what the run's fleets survived so far, all attempts (process 0,
        at every checkpoint and stop; a resumed run reads it back)."""
        if self.is_main:
            atomic_write_text(self.out / FLEET_FILE, json.dumps(self._fleet_stats()))

    def _fleet_stats(self) -> dict[str, Any]:
        """What this process's fleets survived: this attempt's fleets (the run's and, with
        ``eval_judge``, the evaluations'; {} before they were built) added to what the run's
        earlier attempts had survived by their last checkpoint or stop (``fleet.json``: a
        resumed run reports its whole history; a kill loses what came after the last
        checkpoint, whose phase is redone)."""
        out = self._fleet_before
        for fleet in (self._fleet, self._eval_fleet):
            if fleet is not None:
                out = merge_fleet_stats(out, fleet.stats.as_dict())
        return redact(out)  # devices named by URL

    def agent(self, screens: ScreenTable | None = None) -> PolicyBatchAgent:
        m = self.sampling_masks()  # what an on-policy learner scores under, too
        return PolicyBatchAgent(self.policy, self.features,
                                screens if screens is not None else self.screens,
                                self.cfg.temperature, m.max_new_tokens, m.constrained,
                                m.copy_text, m.copy_once)

    def _train_tasks(self):
        return self.phones.train_tasks

    def _test_tasks(self):
        return self.phones.test_tasks

    def phone_day(self, iteration: int | None = None) -> int:
        """The phone's drift day after ``iteration`` online iterations (None: the iterations
        done; the pile's -1: none): ``day + floor(k * days_per_iteration)`` on a world with
        drift days (the simulator), ``day`` elsewhere (:meth:`WorldInfo.day
        <digirl_lite.envs.base.WorldInfo.day>`)."""
        k = self.iteration if iteration is None else iteration
        return self.world_info.day(self.cfg.day, self.cfg.days_per_iteration, k)

    def _reset_kw(self, iteration: int | None = None) -> dict[str, Any]:
        """``collect``'s options for the phone's drift day after ``iteration`` online
        iterations (``reset_options``; {} on a world that does not drift)."""
        if self.cfg.day != 1 or self.cfg.days_per_iteration:  # drift (env "sim" only)
            return {"reset_options": self.world_info.reset_options(self.phone_day(iteration))}
        return {}

    def _collect(self, stage: str, agent: PolicyBatchAgent, tasks: Sequence[Any],
                 screens: ScreenTable, *, id_prefix: str, seed: int = 0, fleet: Any = None,
                 **kw: Any):
        """``fleet.collect`` for ``stage`` (``fleet``: :meth:`fleet` when None), counting
        unjudged steps. Episode ``k`` of
        ``tasks`` is ``{id_prefix}-{k:05d}`` with env seed ``seed + k`` whatever the number
        of processes: with N processes each collects its own contiguous share and the
        episodes (and their screens) are exchanged, so every process returns all of them.

        When the judge cannot answer (``max_unjudged_steps`` in a row, or no verdict for
        ``max_unjudged_s``) or no device is left, what had finished is kept aside
        (:meth:`_stop_run`) and :class:`RunStopped` says why.

        A background collection (``learner="async"``) is stopped first (the fleet collects
        one thing at a time); the next take starts it again."""
        self._stop_collecting()
        kw.update(self._reset_kw(kw.get("iteration")))
        a = self.rank * len(tasks) // self.world_size
        b = (self.rank + 1) * len(tasks) // self.world_size
        stopped: dict[str, Any] | None = None
        with self._bar(b - a, f"{stage}: episodes", unit="ep") as bar:
            def started(_slot: int, obs: Observation) -> None:
                if obs.step == 0:
                    bar.update()

            try:
                episodes = (fleet if fleet is not None else self.fleet()).collect(
                    agent, list(tasks[a:b]), screens, id_prefix=id_prefix, seed=seed + a,
                    on_step=started, **kw)
            except (JudgeUnavailable, NoDevicesLeft) as e:
                episodes, stopped = e.episodes, self._why_stopped(e)
        if self.world_size > 1:
            episodes, stopped = self._exchange(episodes, stopped, screens, id_prefix, a)
        if stopped is not None:
            self._stop_run(stage, [ep.trajectory for ep in episodes], screens, stopped)
        self._tally_unjudged(stage, [ep.trajectory for ep in episodes])
        return episodes

    def _why_stopped(self, e: JudgeUnavailable | NoDevicesLeft) -> dict[str, Any]:
        """What :meth:`_stop_run` says and logs about a collection that had to stop."""
        if isinstance(e, NoDevicesLeft):
            return {"why": f"no device was left (every one quarantined): {e.reason}",
                    "fix": "bring the devices back and resume", "log": {"reason": e.reason,
                                                                          "no_devices": True}}
        quiet = f" (no verdict for {e.seconds:.0f} s)" if e.seconds is not None else ""
        return {"why": f"{e.n} steps in a row were unjudged{quiet}; the last one: {e.reason} "
                       f"(the judge's config: {self.cfg.judge})", "fix": "fix the judge and resume",
                "log": {"unjudged_in_a_row": e.n, "reason": e.reason,
                        "seconds_without_verdict": e.seconds}}

    def _stop_run(self, stage: str, got: list[Trajectory], screens: ScreenTable,
                  stopped: dict[str, Any]) -> None:
        """The judge could not answer or no device was left (``stopped``, from
        :meth:`_why_stopped`): keep what had finished (``got``) in a store of its own,
        ``stopped/<stage>``, raise :class:`RunStopped`.

        The run's store and checkpoints are left as they were: the last checkpoint is at
        the start of the phase that stopped (one is saved after every phase, iteration and
        evaluation), so ``--resume`` redoes that phase whole, with the same task draws, and
        never mistakes a part of a pile or an iteration for all of it (issue 29)."""
        self.features.fill(screens)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", stage).strip("-")
        n = 1 + sum(1 for p in (self.out / "stopped").glob(f"{name}-*"))
        where = self.out / "stopped" / f"{name}-{n}"  # each stop its own: none overwritten
        if self.is_main and got:
            TrajectoryStore.create(where, screens.feature_dim).append(got, screens)
        latest = self.out / "checkpoints" / "latest"
        resume = (f"--resume goes on from checkpoint {latest.read_text().strip()} (the start "
                  f"of {stage})" if latest.is_file() else "the run starts over")
        self.log(stage="stopped", during=stage, **stopped["log"], kept_trajectories=len(got),
                 kept_in=str(where) if got else None, fleet=self._fleet_stats())
        self._save_fleet_stats()  # a resumed run's summary names the devices that left
        kept = f"kept in {where}" if got else "none to keep"
        raise RunStopped(
            f"stopped during {stage}: {stopped['why']}. {len(got)} finished trajectories: "
            f"{kept}; {stopped['fix']}: {resume}")

    def _tally_unjudged(self, stage: str, trajs: Sequence[Trajectory]) -> None:
        """Count ``trajs``' unjudged steps and steps under ``stage`` (the judge's
        reliability in the summary)."""
        steps = sum(len(t) for t in trajs)
        unjudged = sum(t.num_unjudged for t in trajs)
        name = "online" if stage.startswith("online") else stage
        tally = self.summary.setdefault("unjudged_steps", {})
        u, n = tally.get(name, (0, 0))
        tally[name] = [u + unjudged, n + steps]

    def _exchange(self, episodes: list, stopped: dict[str, Any] | None,
                  screens: ScreenTable, id_prefix: str, first: int):
        """Every process's episodes (renamed to their index in the whole task list) and the
        screens they visit (images and features), on every process, in task order."""
        from dataclasses import replace

        def renamed(ep):
            k = int(ep.trajectory.traj_id.rsplit("-", 1)[1])
            return replace(ep, trajectory=replace(ep.trajectory,
                                                  traj_id=f"{id_prefix}-{first + k:05d}"))

        episodes = [renamed(ep) for ep in episodes]
        self.features.fill(screens)
        rows = self._screen_rows([ep.trajectory for ep in episodes], screens)
        parts = dist.all_gather((episodes, rows, stopped))
        out: list = []
        stops = []
        for r, (eps, rws, stop) in enumerate(parts):
            out += eps
            if stop is not None:
                stops.append(stop)
            if r != self.rank:
                for sid, img, feats in rws:
                    screens.add(img, feats, screen_id=sid)
        return out, (stops[0] if stops else None)

    @staticmethod
    def _screen_rows(trajs: Sequence[Trajectory], screens: ScreenTable) -> list[tuple]:
        """(id, decoded image, features) of every screen ``trajs`` visit, once each."""
        seen: dict[str, None] = {}
        for t in trajs:
            for st in t.steps:
                seen.setdefault(st.screen_id)
                seen.setdefault(st.next_screen_id)
        feats = screens.features(list(seen)) if seen else []
        return [(sid, screens.image(sid), f) for sid, f in zip(seen, feats)]
