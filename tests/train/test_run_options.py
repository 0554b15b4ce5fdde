"""Small guarantees of a run's options: typed ``--set`` values, the cache folder's default,
Filtered BC without critics, the smoke run's starting policy, what a newcomer sees."""

from __future__ import annotations

import argparse

import pytest

from digirl_lite.paths import user_cache_dir
from digirl_lite.train.cli import cache_dir_of, config_from_args, run_parser
from digirl_lite.train.config import DigiRLConfig, sim_quick
from digirl_lite.train.trainer import USER_CACHE, Trainer


def _args(*argv: str) -> argparse.Namespace:
    return run_parser("test").parse_args(list(argv))


@pytest.mark.parametrize("item, field, want", [
    ("iterations=ten", "iterations", "int"),
    ("critic_lr=\"fast\"", "critic_lr", "float"),
    ("tensorboard=1", "tensorboard", "bool"),
    ("judge=[1, 2]", "judge", "dict"),
    ("n_envs=2.5", "n_envs", "int"),
])
def test_set_values_are_checked_against_the_field_type(item, field, want):
    with pytest.raises(SystemExit, match=f"{field} must be {want}"):
        config_from_args(_args("--quick", "--set", item))


def test_set_values_of_the_right_type_pass_and_ints_become_floats():
    cfg = config_from_args(_args("--quick", "--set", "critic_lr=1", "iterations=3",
                                 "critic_init_value=null", 'judge={"judge": "oracle"}'))
    assert cfg.critic_lr == 1.0 and isinstance(cfg.critic_lr, float)
    assert cfg.iterations == 3 and cfg.critic_init_value is None
    with pytest.raises(ValueError, match="seed must be int"):
        DigiRLConfig.from_dict({"seed": "0"})  # JSON config files are checked the same way


def test_cache_dir_defaults_to_the_user_cache_not_the_working_directory(tmp_path,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DIGIRL_LITE_CACHE", str(tmp_path / "mine"))
    assert user_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("DIGIRL_LITE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "digirl_lite"
    assert cache_dir_of(_args()) == USER_CACHE
    assert cache_dir_of(_args("--cache-dir", "")) is None
    assert cache_dir_of(_args("--cache-dir", "here")) == "here"
    t = Trainer(sim_quick(n_envs=2), tmp_path / "run", progress=False)
    assert t.cache_dir == tmp_path / "xdg" / "digirl_lite"
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # a Trainer's whole run: 3 s
def test_filtered_bc_trains_no_critics(tmp_path):
    """Filtered BC never reads the critics, so the run builds none and spends no time on
    them (its learner asks for none: ``critics``)."""
    t = Trainer(sim_quick(algorithm="filtered_bc", pile_size=4, eval_tasks=2, n_envs=2,
                          offline_critic_updates=3, offline_actor_updates=1),
                tmp_path / "run", cache_dir=None, progress=False)
    assert t.step_critic is None and t.instr_critic is None and t.critic_opt is None
    t.build_starting_policy()
    pile = t.build_pile()
    t.offline(pile)
    assert "offline_critics" in t.timings and t.timings["offline_critics"] < 0.05
    assert t.learner.train_critics(5) == {}


def test_quick_starts_from_the_shipped_policy():
    cfg = sim_quick()
    assert cfg.starting_policy == "shipped"
    # the shipped policy's SFT settings, so its key matches (else loading would refuse)
    d = DigiRLConfig()
    assert (cfg.sft_demos, cfg.sft_updates, cfg.sft_copy_updates) == (
        d.sft_demos, d.sft_updates, d.sft_copy_updates)
