"""Fleets: sync / async / Ray give the same kind of trajectories; faults never become failures."""

from __future__ import annotations

import itertools
import os
import time

import numpy as np
import pytest
from needs import optional_import
from phone_agents import experts

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.data import Ending, ScreenTable
from digirl_lite.envs.sim import ScriptedExpert, SimEnvFactory, SimPhoneEnv, Surprises
from digirl_lite.rollout import (
    AsyncFleet,
    LocalFleet,
    ProcessFleet,
    ScriptedBatchAgent,
    SyncFleet,
    make_fleet,
    training_trajectories,
)

TASKS = SimPhoneEnv("webshop_test").tasks[:10]
CLEAN = SimEnvFactory(tasks="webshop_test", surprises=Surprises.none())


def _content(episodes):
    return [(e.trajectory.traj_id, e.trajectory.ending, e.trajectory.seeds,
             [(s.action_text, s.screen_id, s.reward, s.done) for s in e.trajectory.steps])
            for e in episodes]


class FaultyFactory:
    """Simulated phones that fail at ``rate`` of their steps, split evenly between a crash,
    a blank screen (no retries left) and the death of the worker that runs the phone
    (``os._exit`` in a worker process or Ray actor, an exception in this process)."""

    def __init__(self, rate: float = 0.10, in_process: bool = False) -> None:
        self.rate, self.in_process = rate, in_process

    def __call__(self, slot: int):
        env = SimPhoneEnv("webshop_test", surprises=Surprises.none(), seed=slot,
                          faults={"crash": self.rate / 3, "blank_screenshot": self.rate / 3,
                                  "blank_retries": 0})
        return _Dying(env, self.rate / 3, self.in_process, slot)


class _Dying:
    def __init__(self, env, p: float, in_process: bool, slot: int) -> None:
        self.env, self.p, self.in_process = env, p, in_process
        self.rng = np.random.default_rng(1000 + slot)

    @property
    def horizon(self):
        return self.env.horizon

    def reset(self, task=None, seed=None):
        return self.env.reset(task=task, seed=seed)

    def step(self, text):
        if self.rng.random() < self.p:
            if self.in_process:
                raise ConnectionError("the simulated worker died")
            os._exit(7)
        return self.env.step(text)

    def close(self):
        self.env.close()


def _check_soak(episodes, n_tasks: int) -> dict[str, int]:
    """Every task came back once; an expert on clean phones only ever succeeds, so every
    other ending must be an infrastructure truncation, kept out of training."""
    ids = [e.trajectory.traj_id for e in episodes]
    assert len(ids) == len(set(ids)) == n_tasks
    endings = [e.trajectory.ending for e in episodes]
    mislabelled = [e for e in endings if e not in (Ending.SUCCESS, Ending.INFRA)]
    assert mislabelled == []
    infra = [e.trajectory for e in episodes if e.trajectory.ending is Ending.INFRA]
    assert all(t.truncation_reason for t in infra)
    assert all(not t.is_usable for t in infra)
    kept = training_trajectories(e.trajectory for e in episodes)
    assert len(kept) == n_tasks - len(infra) and all(t.is_success for t in kept)
    return {"success": n_tasks - len(infra), "infra": len(infra)}


# -- names ---------------------------------------------------------------------------------
def test_fleet_names_and_factory():
    assert issubclass(LocalFleet, SyncFleet) and issubclass(ProcessFleet, SyncFleet)
    for name, cls in (("sync", SyncFleet), ("local", SyncFleet), ("async", AsyncFleet)):
        fleet = make_fleet(name, CLEAN, 2)
        assert type(fleet) is cls
        fleet.close()
    with pytest.raises(ValueError, match="unknown fleet"):
        make_fleet("lockstep", CLEAN, 2)
    with pytest.raises(ValueError, match="backend"):
        make_fleet("async", CLEAN, 2, backend="ssh")


# -- asynchronous --------------------------------------------------------------------------
@pytest.mark.slow
def test_async_fleet_gives_the_sync_fleets_trajectories():
    sync = SyncFleet(CLEAN, 3).collect(experts(), TASKS, ScreenTable(), id_prefix="x", seed=4)
    with AsyncFleet(CLEAN, 3) as fleet:
        fleet.policy_version = 7
        screens = ScreenTable()
        eps = fleet.collect(experts(), TASKS, screens, id_prefix="x", seed=4)
    assert _content(eps) == _content(sync)
    assert all(s.policy_version == 7 for e in eps for s in e.trajectory.steps)
    assert all(s.screen_id in screens for e in eps for s in e.trajectory.steps)
    assert fleet.stats.episodes == len(TASKS)
    assert fleet.stats.steps == sum(len(e.trajectory) for e in eps)


@pytest.mark.slow
def test_async_fleet_batches_whatever_is_ready():
    sizes = []

    class Recorder(ScriptedBatchAgent):
        def act_batch(self, slots, observations):
            sizes.append(len(slots))
            return super().act_batch(slots, observations)

    slow = SimEnvFactory(tasks="webshop_test", surprises=Surprises.none(),
                         faults={"latency_median_s": 0.01, "latency_sigma": 1.0})
    with AsyncFleet(slow, 4, min_batch=4, batch_wait_s=5.0) as fleet:
        fleet.collect(Recorder(lambda s: ScriptedExpert()), TASKS[:4], ScreenTable(),
                      id_prefix="b")
    assert sizes[0] == 4 and max(sizes) <= 4  # waited for all four, never more than ready
    with AsyncFleet(slow, 4) as fleet:  # no waiting: phones go on one by one
        sizes.clear()
        fleet.collect(Recorder(lambda s: ScriptedExpert()), TASKS[:8], ScreenTable(),
                      id_prefix="b")
    assert min(sizes) == 1


@pytest.mark.slow
def test_take_returns_completed_trajectories_and_carries_the_rest():
    with AsyncFleet(CLEAN, 3) as fleet:
        fleet.start(experts(), itertools.cycle(TASKS), ScreenTable(), id_prefix="s")
        first = fleet.take(4, timeout_s=60)
        with fleet.updating_policy():  # the learner's update
            pass
        second = fleet.take(4, timeout_s=60)
        left = fleet.stop()
    got = first + second
    assert len(first) == len(second) == 4
    assert len({e.trajectory.traj_id for e in got}) == 8
    assert all(e.trajectory.is_success for e in got)  # only completed ones, never a middle
    versions = {s.policy_version for e in second for s in e.trajectory.steps}
    assert versions <= {0, 1} and fleet.policy_version == 1
    # nothing completed is lost: what was not taken stop() returns, or it never finished
    s = fleet.stats
    assert s.episodes == len(got) + len(left) and fleet.stop() == []
    assert s.discarded_unfinished <= 3


class LongAndShort:
    """Ends ``SHORT`` tasks at once (STATUS_TASK_COMPLETE) and the others after
    ``LONG_STEPS`` presses of HOME: with every step taking 50 ms, which episode ends first
    is known."""

    LONG_STEPS = 10

    def act_batch(self, slots, observations):
        return [format_action(Action(ActionType.STATUS_TASK_COMPLETE)
                              if o.task in SHORT or o.step >= self.LONG_STEPS
                              else Action(ActionType.PRESS_HOME)) for o in observations]


SHORT = {TASKS[2].text, TASKS[3].text}
SLOW = SimEnvFactory(tasks="webshop_test", surprises=Surprises.none(),
                     faults={"latency_median_s": 0.05, "latency_sigma": 0.0})


def _index(episode) -> int:
    return int(episode.trajectory.traj_id.rsplit("-", 1)[1])


@pytest.mark.slow
def test_take_in_completion_order_favours_short_episodes_and_in_start_order_does_not():
    """Three phones on long, long, short, short, ... (a long episode takes 0.55 s, a short
    one 0.05 s): the first two to complete are the two short ones (tasks 2 and 3), the
    first two to start the two long ones (tasks 0 and 1)."""
    tasks = [TASKS[i % 4] for i in range(40)]
    with AsyncFleet(SLOW, 3) as fleet:
        fleet.start(LongAndShort(), tasks, ScreenTable(), id_prefix="c")
        assert sorted(map(_index, fleet.take(2, timeout_s=60))) == [2, 3]
        fleet.stop()
        fleet.start(LongAndShort(), tasks, ScreenTable(), id_prefix="s", order="start")
        first = fleet.take(2, timeout_s=60)
        assert [_index(e) for e in first] == [0, 1]
        assert [len(e.trajectory.steps) for e in first] == [LongAndShort.LONG_STEPS + 1] * 2
        assert [_index(e) for e in fleet.take(3, timeout_s=60)] == [2, 3, 4]
        fleet.stop()
    with pytest.raises(ValueError, match="order"):
        AsyncFleet(SLOW, 1).start(LongAndShort(), tasks, ScreenTable(), id_prefix="x",
                                  order="shortest")


@pytest.mark.slow
def test_a_stop_in_start_order_keeps_only_what_started_before_the_oldest_running():
    """After the long tasks 0 and 1 are taken, phones run 2, 3 (short), 4, 5 (long), 6, 7
    (short), ...; a stop 0.3 s later finds 5 still running: 2, 3, 4 are returned in order,
    the short ones that completed after 5 started are dropped and counted, and every
    episode is accounted for."""
    tasks = [TASKS[i % 4] for i in range(40)]
    with AsyncFleet(SLOW, 3) as fleet:
        fleet.start(LongAndShort(), tasks, ScreenTable(), id_prefix="s", order="start")
        taken = fleet.take(2, timeout_s=60)
        time.sleep(0.3)
        left = fleet.stop()
        s = fleet.stats
    ks = [_index(e) for e in left]
    assert ks == list(range(2, 2 + len(ks))) and len(ks) >= 2
    assert s.discarded_out_of_order >= 1 and s.discarded_unfinished >= 1
    assert s.episodes == len(taken) + len(left) + s.discarded_out_of_order


def test_agent_errors_surface_in_collect():
    class Broken:
        def act_batch(self, slots, observations):
            raise ZeroDivisionError("policy bug")

    with AsyncFleet(CLEAN, 2) as fleet, pytest.raises(RuntimeError) as err:
        fleet.collect(Broken(), TASKS[:2], ScreenTable(), id_prefix="e")
    assert isinstance(err.value.__cause__, ZeroDivisionError)


@pytest.mark.slow
def test_infrastructure_truncations_stay_out_of_training_unless_asked():
    fleet = SyncFleet(SimEnvFactory(tasks="webshop_test", faults={"crash": 0.3}), 2)
    trajs = [e.trajectory for e in fleet.collect(experts(), TASKS, ScreenTable(),
                                                 id_prefix="i", seed=2)]
    infra = [t for t in trajs if t.is_infra_truncated and t.steps]
    assert infra, "expected some crashes mid-episode"
    assert not any(t.is_infra_truncated for t in training_trajectories(trajs))
    terminal = training_trajectories(trajs, infra="terminal")
    assert len(terminal) == len(training_trajectories(trajs)) + len(infra)
    as_failures = [t for t in terminal if t.traj_id in {i.traj_id for i in infra}]
    assert all(t.is_usable and t.final_reward == 0 and t.steps[-1].done for t in as_failures)
    assert all(s.mc_return == 0 for t in as_failures for s in t.steps)
    with pytest.raises(ValueError):
        training_trajectories(trajs, infra="bootstrap")


@pytest.mark.parametrize("fleet_cls", [SyncFleet, AsyncFleet])
def test_a_device_that_keeps_failing_is_reset_and_its_tasks_tried_again(fleet_cls):
    """Every step crashes: each task is tried ``max_task_attempts`` times (issue 29), the
    attempts that went back to the queue are counted, not returned, and the device is reset
    after ``max_consecutive_faults`` faulted episodes in a row (it starts them, so it is
    never quarantined)."""
    always = SimEnvFactory(tasks="webshop_test", faults={"crash": 1.0})
    with fleet_cls(always, 1, max_consecutive_faults=2) as fleet:
        eps = fleet.collect(experts(), TASKS[:5], ScreenTable(), id_prefix="f")
    assert [e.trajectory.traj_id for e in eps] == [f"f-{k:05d}" for k in range(5)]
    assert all(e.trajectory.ending is Ending.INFRA for e in eps)
    s = fleet.stats
    assert s.infra_truncations == {"device": 15, "worker": 0}
    assert (s.episodes, s.requeued, s.device_resets, s.quarantined) == (5, 10, 7, 0)
    with fleet_cls(always, 1, max_consecutive_faults=2, max_task_attempts=1) as fleet:
        fleet.collect(experts(), TASKS[:5], ScreenTable(), id_prefix="f")
    assert (fleet.stats.episodes, fleet.stats.requeued, fleet.stats.device_resets) == (5, 0, 2)


@pytest.mark.slow
def test_soak_async_with_faults_at_ten_percent_of_steps():
    """Crashes, blank screens and dying worker processes at 10% of steps."""
    n = 60
    tasks = [TASKS[i % len(TASKS)] for i in range(n)]
    with AsyncFleet(FaultyFactory(0.10), 4, backend="process", timeout_s=60) as fleet:
        eps = fleet.collect(experts(), tasks, ScreenTable(), id_prefix="soak", seed=11)
    counts = _check_soak(eps, n)
    s = fleet.stats
    # every faulted attempt either went back to the queue or is returned (its last)
    assert counts["infra"] == sum(s.infra_truncations.values()) - s.requeued > 0
    assert 0 < s.requeued <= 2 * n
    assert s.infra_truncations["worker"] > 0 and s.worker_restarts >= s.infra_truncations[
        "worker"]
    assert s.episodes == n


@pytest.mark.slow
def test_soak_in_process_and_stream_loses_nothing():
    with AsyncFleet(FaultyFactory(0.10, in_process=True), 4) as fleet:
        fleet.start(experts(), itertools.cycle(TASKS), ScreenTable(), id_prefix="st")
        got = []
        for _ in range(5):
            got += fleet.take(6, timeout_s=120)
        left = fleet.stop()
    counts = _check_soak(got + left, len(got) + len(left))
    assert counts["infra"] > 0 and fleet.stats.episodes == len(got) + len(left)


# -- Ray -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
    ray = optional_import("ray")
    import sys

    # the actors cannot import this test module: ship its classes by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


class PlanAgent:
    """A worker-side agent whose 'weights' say what to do: ``{"plan": "expert"|"home"}``."""

    def __init__(self, slot: int) -> None:
        self.plan = "expert"

    def load_weights(self, weights) -> None:
        self.plan = weights["plan"]

    def act(self, obs) -> str:
        if self.plan == "home":
            return format_action(Action(ActionType.PRESS_HOME))
        return ScriptedExpert().act(obs)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_fleet_gives_the_sync_fleets_trajectories_and_ships_weights(ray_cluster):
    from digirl_lite.rollout import RayFleet

    sync = SyncFleet(CLEAN, 2).collect(experts(), TASKS[:6], ScreenTable(), id_prefix="r",
                                       seed=1)
    fleet = RayFleet(CLEAN, 4, devices_per_actor=2)
    try:
        assert not fleet._owns_ray and len(fleet.actors) == 2
        eps = fleet.collect(experts(), TASKS[:6], ScreenTable(), id_prefix="r", seed=1)
        assert _content(eps) == _content(sync)
    finally:
        fleet.close()
    assert ray_cluster.is_initialized()  # the fleet leaves a cluster it did not start

    fleet = RayFleet(CLEAN, 2, worker_agent=PlanAgent)
    try:
        eps = fleet.collect(None, TASKS[:2], ScreenTable(), id_prefix="r", seed=1)
        assert _content(eps) == _content(sync[:2])
        assert fleet.set_weights({"plan": "home"}) == 1
        eps = fleet.collect(None, TASKS[:2], ScreenTable(), id_prefix="r", seed=1)
        assert all(s.action.action_type is ActionType.PRESS_HOME and s.policy_version == 1
                   for e in eps for s in e.trajectory.steps)
    finally:
        fleet.close()


@pytest.mark.ray
@pytest.mark.slow
def test_ray_soak_dead_actors_are_replaced_and_never_failures(ray_cluster):
    from digirl_lite.rollout import RayFleet

    n = 40
    tasks = [TASKS[i % len(TASKS)] for i in range(n)]
    fleet = RayFleet(FaultyFactory(0.10), 4, timeout_s=60)
    try:
        eps = fleet.collect(experts(), tasks, ScreenTable(), id_prefix="rs", seed=3)
        counts = _check_soak(eps, n)
        s = fleet.stats
        assert counts["infra"] == sum(s.infra_truncations.values()) - s.requeued > 0
        assert s.requeued > 0
        assert s.infra_truncations["worker"] > 0 and s.worker_restarts > 0
        pids = ray_cluster.get([a.pid.remote() for a in fleet.actors])
        assert len(set(pids)) == 4  # every actor answers again
    finally:
        fleet.close()

