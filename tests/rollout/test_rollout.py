"""Fleets and evaluation: lockstep collection, process workers, crashes, failure kinds."""

from __future__ import annotations

import os

import pytest
from phone_agents import experts

from digirl_lite.data import Ending, ScreenTable
from digirl_lite.envs.sim import Copier, SimEnvFactory, SimPhoneEnv, Surprises
from digirl_lite.envs.sim.oracle import OracleJudge
from digirl_lite.judge import JudgeResult
from digirl_lite.rollout import RECORD_SIZE
from digirl_lite.rollout.fleet import LocalFleet, ProcessFleet, ScriptedBatchAgent
from digirl_lite.train.evaluate import FAILURE_KINDS, evaluate, failure_kind, summarize

TASKS = SimPhoneEnv("webshop_test").tasks[:10]


def _content(episodes):
    return [(e.trajectory.traj_id, e.trajectory.ending,
             [(s.action_text, s.screen_id, s.reward) for s in e.trajectory.steps])
            for e in episodes]


@pytest.mark.slow
def test_local_fleet_collects_every_task_in_order():
    fleet = LocalFleet(SimEnvFactory(tasks="webshop_test"), n_envs=3)
    screens = ScreenTable()
    eps = fleet.collect(experts(), TASKS, screens, id_prefix="t", seed=5)
    assert [e.trajectory.traj_id for e in eps] == [f"t-{k:05d}" for k in range(10)]
    assert [e.trajectory.task for e in eps] == [t.text for t in TASKS]
    assert all(e.trajectory.is_success for e in eps)
    assert all(e.trajectory.seeds == {"env": 5 + k} for k, e in enumerate(eps))
    assert all(len(e.states) == len(e.trajectory) + 1 for e in eps)
    for e in eps:
        for s in e.trajectory.steps:
            assert s.screen_id in screens and s.next_screen_id in screens
    assert all(screens.image(i).size == RECORD_SIZE for i in screens.ids)
    # the same seeds give the same episodes whatever the fleet size
    again = LocalFleet(SimEnvFactory(tasks="webshop_test"), n_envs=7).collect(
        experts(), TASKS, ScreenTable(), id_prefix="t", seed=5)
    assert _content(again) == _content(eps)


@pytest.mark.slow
def test_process_fleet_matches_local_fleet():
    local = LocalFleet(SimEnvFactory(tasks="webshop_test"), n_envs=2).collect(
        experts(), TASKS[:4], ScreenTable(), id_prefix="p", seed=1)
    with ProcessFleet(SimEnvFactory(tasks="webshop_test"), n_envs=2) as fleet:
        remote = fleet.collect(experts(), TASKS[:4], ScreenTable(), id_prefix="p", seed=1)
    assert _content(remote) == _content(local)


class KillerJudge(OracleJudge):
    """Kills its own worker process when asked to judge a task about ebay."""

    def judge(self, task, prev, cur, *, history=None, state=None) -> JudgeResult:
        if "ebay" in str(task):
            os._exit(3)
        return super().judge(task, prev, cur, state=state)


def make_killer_env(slot):
    return SimPhoneEnv("webshop_test", judge=KillerJudge(), seed=slot,
                       surprises=Surprises.none())


@pytest.mark.slow
def test_a_dead_worker_is_an_infrastructure_truncation_and_is_restarted():
    tasks = ["Go to costco.com", "Go to ebay.com", "Go to walmart.com", "Go to target.com"]
    with ProcessFleet(make_killer_env, n_envs=2, timeout_s=30) as fleet:
        eps = fleet.collect(experts(), tasks, ScreenTable(), id_prefix="k")
        assert fleet.restarts >= 1
    endings = [e.trajectory.ending for e in eps]
    assert endings[1] is Ending.INFRA and "worker" in eps[1].trajectory.truncation_reason
    assert endings[0] is endings[2] is endings[3] is Ending.SUCCESS
    assert not eps[1].trajectory.is_usable


def test_environment_faults_become_infrastructure_endings():
    fleet = LocalFleet(SimEnvFactory(tasks="webshop_test", faults={"crash": 1.0}), n_envs=2)
    eps = fleet.collect(experts(), TASKS[:3], ScreenTable(), id_prefix="c")
    assert all(e.trajectory.ending is Ending.INFRA for e in eps)
    assert all(failure_kind(e) == "infrastructure" for e in eps)
    s = summarize(eps)
    assert s["failure_kinds"]["infrastructure"] == 3 and s["episodes"] == 3


@pytest.mark.slow
def test_evaluate_reports_success_interval_and_failure_kinds():
    fleet = LocalFleet(SimEnvFactory(tasks="webshop_test"), n_envs=8)
    report, eps = evaluate(fleet, ScriptedBatchAgent(lambda slot: Copier(seed=slot)),
                           SimPhoneEnv("webshop_test").tasks, n_tasks=48)
    assert report["episodes"] == report["judged_episodes"] == len(eps) == 48  # no faults
    wins = sum(e.trajectory.is_success for e in eps)  # counted from the episodes themselves
    assert report["successes"] == wins and report["success_rate"] == wins / 48
    lo, hi = report["ci95"]
    assert lo <= report["success_rate"] < hi and hi - lo < 0.35  # a real interval around it
    assert set(report["failure_kinds"]) == set(FAILURE_KINDS)
    failures = 48 - report["successes"]
    assert sum(report["failure_kinds"].values()) == failures > 0
    assert report["failure_kinds"]["never_reached_site"] > 0  # pop-ups on the way
    ok, _ = evaluate(fleet, experts(), SimPhoneEnv("webshop_test").tasks, n_tasks=16)
    assert ok["success_rate"] == 1.0 and sum(ok["failure_kinds"].values()) == 0
