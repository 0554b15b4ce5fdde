"""Drift in a run: the simulated phone's day follows the online iterations (``day``,
``days_per_iteration``), through every fleet, without rebuilding it; a frozen policy
(``actor_updates=0``) keeps its weights."""

from __future__ import annotations

import pytest
import torch

from digirl_lite.data import ScreenTable, load_trajectories
from digirl_lite.envs.sim import ScriptedExpert, SimEnvFactory, SimPhoneEnv, Surprises
from digirl_lite.envs.sim.render import screen_key
from digirl_lite.envs.sim.world import initial_state
from digirl_lite.errors import ConfigError
from digirl_lite.paths import data_dir
from digirl_lite.policy import AutoUIPolicy
from digirl_lite.rollout import ScriptedBatchAgent, make_fleet
from digirl_lite.train.config import DigiRLConfig, sim_quick
from digirl_lite.train.trainer import Trainer

TASKS = SimPhoneEnv("webshop_test").tasks[:4]


def launcher(day: int) -> str:
    """The screen id an episode starts from on ``day``."""
    return screen_key(initial_state(day))


def test_launchers_of_the_tests_days_differ():
    # app icons are recoloured and the search widget moves as days pass: the tests below
    # can tell days 1, 5, 8 and 11 apart from an episode's first screen
    assert len({launcher(1), launcher(5), launcher(8), launcher(11)}) == 4


def test_reset_option_moves_the_phone_to_a_day():
    env = SimPhoneEnv("webshop_test", surprises=Surprises.none())
    obs, _ = env.reset(TASKS[0], seed=0)
    assert obs.screen_id == launcher(1)
    obs, _ = env.reset(TASKS[0], seed=0, options={"day": 8})
    assert obs.screen_id == launcher(8) and obs.state.day == 8
    obs, _ = env.reset(TASKS[0], seed=0)  # the phone stays on its new day
    assert obs.screen_id == launcher(8)
    with pytest.raises(ValueError, match="unknown reset option 'hour'"):
        env.reset(TASKS[0], options={"hour": 3})
    with pytest.raises(ValueError, match="day must be an int >= 1"):
        env.reset(TASKS[0], options={"day": 0})


@pytest.mark.parametrize("fleet", ["local", "async", pytest.param("process",
                                                                  marks=pytest.mark.slow)])
@pytest.mark.slow
def test_fleets_pass_reset_options_to_every_reset(fleet):
    with make_fleet(fleet, SimEnvFactory(tasks="webshop_test", surprises=Surprises.none()),
                    n_envs=2) as f:
        agent = ScriptedBatchAgent(lambda slot: ScriptedExpert())
        for day in (1, 8, 11):
            eps = f.collect(agent, TASKS, ScreenTable(), id_prefix=f"d{day}",
                            reset_options={"day": day} if day > 1 else None)
            assert [e.trajectory.steps[0].screen_id for e in eps] == [launcher(day)] * 4


def test_drift_config_is_checked():
    cfg = DigiRLConfig(day=3, days_per_iteration=1)
    assert cfg.days_per_iteration == 1.0 and isinstance(cfg.days_per_iteration, float)
    with pytest.raises(ValueError, match="day must be >= 1"):
        DigiRLConfig(day=0)
    with pytest.raises(ValueError, match="days_per_iteration >= 0"):
        DigiRLConfig(days_per_iteration=-0.5)
    for field, value in (("day", 2), ("days_per_iteration", 0.5)):
        with pytest.raises(ConfigError, match=f"^{field}: drift is the simulated phone's"):
            DigiRLConfig(env="android", **{field: value})


@pytest.mark.slow  # a Trainer run: ~10 s of CPU
def test_online_iterations_and_evaluations_run_on_the_days_that_passed(tmp_path):
    """Day 5, three days an iteration: iteration 1 collects on day 8 and iteration 2 on day
    11; the copier is evaluated on day 5, online-1 on day 8, the final one on day 11. With
    ``actor_updates=0`` (frozen) the policy leaves the online phase as it came in."""
    cfg = sim_quick(day=5, days_per_iteration=3.0, actor_updates=0, iterations=2,
                    eval_every=1, rollouts_per_iteration=2, n_envs=2, eval_tasks=2,
                    critic_updates=1, critic_batch=8, max_new_tokens=32, horizon=2)
    trainer = Trainer(cfg, tmp_path / "run", cache_dir=None, progress=False)
    assert [trainer.phone_day(k) for k in (-1, 0, 1, 2, 10)] == [5, 5, 8, 11, 35]
    summary = trainer.run(offline=False)
    trajs, _ = load_trajectories(tmp_path / "run" / "store", with_images=False)
    firsts = {(t.iteration, t.steps[0].screen_id) for t in trajs if t.steps}
    assert firsts == {(1, launcher(8)), (2, launcher(11))}
    assert {s: r["day"] for s, r in summary["stages"].items()} == {
        "copier": 5, "online-1": 8, "online": 11}
    for stage, day in (("copier", 5), ("online-1", 8), ("online", 11)):
        ev, _ = load_trajectories(tmp_path / "run" / "eval" / stage, with_images=False)
        assert {t.steps[0].screen_id for t in ev} == {launcher(day)}
    start = AutoUIPolicy.load(data_dir() / "policies" / "sft-webshop")
    for (name, p), q in zip(trainer.policy.model.state_dict().items(),
                            start.model.state_dict().values()):
        assert torch.equal(p.cpu(), q.cpu()), f"{name} changed under actor_updates=0"
