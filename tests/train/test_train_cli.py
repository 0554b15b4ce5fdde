"""Run shapes and configuration: offline-only / online-only runs, evaluation only, the
shipped starting policy's guard, real-setting configs that fail early, TensorBoard."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from needs import optional_import

from digirl_lite.data import load_trajectories
from digirl_lite.envs.sim import Surprises
from digirl_lite.paths import data_dir
from digirl_lite.train.config import ConfigError, DigiRLConfig, load_config, sim_quick
from digirl_lite.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "recipes" / "configs"
TINY = {"starting_policy": "sft", "sft_demos": 20, "sft_updates": 5, "sft_copy_updates": 20,
        "pile_size": 6, "iterations": 1, "rollouts_per_iteration": 4, "n_envs": 4,
        "eval_tasks": 4}


def test_set_given_twice_sets_both_fields():
    """``--set a=1 --set b=2`` sets both (argparse kept only the last ``--set`` before)."""
    from digirl_lite.train.cli import config_from_args, run_parser

    args = run_parser("x").parse_args(["--quick", "--set", "iterations=3", "eval_every=0",
                                       "--set", "eval_tasks=12", "--set", "fleet=async"])
    cfg = config_from_args(args)
    assert (cfg.iterations, cfg.eval_every, cfg.eval_tasks, cfg.fleet) == (3, 0, 12, "async")


def test_surprises_scaled():
    s = Surprises().scaled(0.1)
    assert s.popup == pytest.approx(0.05) and s.voice == pytest.approx(0.035)
    assert Surprises().scaled(0.0) == Surprises.none()
    with pytest.raises(ValueError, match="factor"):
        Surprises().scaled(1.5)


@pytest.mark.parametrize("name", ["webshop_emulator", "general_emulator",
                                  "webshop_real_checkpoint"])
def test_real_setting_configs_fail_early_naming_each_missing_path(name):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / f"{name}.json")
    msg = str(e.value)
    assert "starting_policy" in msg and "image_encoder" in msg
    if "emulator" in name:
        assert "sdk_root" in msg and "task_file" in msg
        cfg = json.loads((CONFIGS / f"{name}.json").read_text())
        assert cfg["horizon"] == (20 if "webshop" in name else 10)


def test_real_setting_config_passes_its_check_once_paths_exist(tmp_path):
    for d in ("sdk", "autoui", "blip2", "roberta"):
        (tmp_path / d).mkdir()
    for f in ("train.txt", "test.txt"):
        (tmp_path / f).write_text("Go to costco.com\n")
    judge = {"judge": "paper", "backend": {"backend": "openai", "model": "qwen-vl",
                                           "base_url": "http://127.0.0.1:8000/v1",
                                           "api_key_env": None}}
    cfg = DigiRLConfig(env="android", android={"emulators": {"avd": "pixel", "n": 2,
                                                             "sdk_root": str(tmp_path / "sdk")}},
                       starting_policy=str(tmp_path / "autoui"),
                       image_encoder=str(tmp_path / "blip2"),
                       text_encoder=str(tmp_path / "roberta"), judge=judge,
                       task_file=str(tmp_path / "train.txt"),
                       test_task_file=str(tmp_path / "test.txt"))
    cfg.check_paths()  # does not raise
    with pytest.raises(ConfigError, match="android.emulators.avd: not set"):
        DigiRLConfig.from_dict({**cfg.as_dict(), "android": {"emulators": {
            "sdk_root": str(tmp_path)}}}).check_paths()
    with pytest.raises(ConfigError, match="task_file: required with emulators"):
        DigiRLConfig.from_dict({**cfg.as_dict(), "task_file": None}).check_paths()


@pytest.mark.slow
def test_main_job_refuses_a_config_with_missing_paths_before_any_work(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "recipes" / "offline_to_online.py"),
                        "--config", str(CONFIGS / "webshop_emulator.json"),
                        "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "cannot run" in p.stderr and "sdk_root" in p.stderr
    assert not (tmp_path / "run").exists()  # nothing was started


def test_bad_config_values_are_refused(tmp_path):
    with pytest.raises(ValueError, match="device"):
        DigiRLConfig(device="tpu")
    with pytest.raises(ValueError, match="env"):
        DigiRLConfig(env="ios")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(bad)


@pytest.mark.slow
def test_shipped_starting_policy_guard(tmp_path, monkeypatch):
    """"shipped" loads <data>/policies/sft-<world> only if it was built with this config's SFT
    settings, and says how to build it when it is missing; another setting's policy shipped
    as policies/sft-<its key> (the paper setting's) is found by its key."""
    shipped = data_dir()  # the package's assets, before $DIGIRL_LITE_DATA replaces them
    data = tmp_path / "data"
    data.mkdir()
    (data / "tasks").symlink_to(shipped / "tasks")
    (data / "tokenizer").symlink_to(shipped / "tokenizer")
    monkeypatch.setenv("DIGIRL_LITE_DATA", str(data))
    cfg = sim_quick(**{**TINY, "starting_policy": "shipped"})
    t = Trainer(cfg, tmp_path / "a", cache_dir=None, progress=False)
    with pytest.raises(FileNotFoundError, match="make_starting_policy"):
        t.build_starting_policy()
    # build it as the recipe does, then load it back
    b = Trainer(sim_quick(**TINY), tmp_path / "b", cache_dir=None,
                progress=False)
    b.build_starting_policy()
    b.save_starting_policy(data / "policies" / "sft-webshop")
    t.build_starting_policy()
    built, loaded = b.policy.model.state_dict(), t.policy.model.state_dict()
    assert built.keys() == loaded.keys()
    differ = [k for k in built if not torch.equal(built[k], loaded[k])]
    assert differ == [], f"the loaded policy differs from the one built in {differ}"
    other = Trainer(sim_quick(**{**TINY, "sft_updates": 6, "starting_policy": "shipped"}),
                    tmp_path / "c", cache_dir=None, progress=False)
    with pytest.raises(ValueError, match="other SFT settings") as err:
        other.build_starting_policy()
    from digirl_lite.train.starting import sft_key

    key = sft_key(other.cfg)
    assert f"policies/sft-{key}" in str(err.value)  # where to ship it
    c = Trainer(sim_quick(**{**TINY, "sft_updates": 6}), tmp_path / "d", cache_dir=None,
                progress=False)
    c.build_starting_policy()
    c.save_starting_policy(data / "policies" / f"sft-{key}")
    other.build_starting_policy()
    assert torch.equal(next(iter(other.policy.model.state_dict().values())),
                       next(iter(c.policy.model.state_dict().values())))
    t.build_starting_policy()  # the main job's still loads its own


@pytest.mark.slow
def test_offline_only_and_online_only_runs(tmp_path):
    off = Trainer(sim_quick(**TINY), tmp_path / "off", cache_dir=None, progress=False)
    s = off.run(online=False)
    assert set(s["stages"]) == {"copier", "offline"} and s["online_trajectories"] == 0
    on = Trainer(sim_quick(**TINY), tmp_path / "on", cache_dir=None, progress=False)
    s = on.run(offline=False)
    assert set(s["stages"]) == {"copier", "online"} and s["online_trajectories"] == 4
    trajs, _ = load_trajectories(tmp_path / "on" / "store")
    assert {t.source.value for t in trajs} == {"online"}  # no pile
    # every evaluation is stored for replay
    ev, _ = load_trajectories(tmp_path / "on" / "eval" / "online")
    assert len(ev) == 4 and all(t.traj_id.startswith("eval-online") for t in ev)


@pytest.mark.slow
def test_the_offline_only_recipe_resumes(tmp_path):
    """recipes/offline_only.py --resume (what the grid passes when the run folder exists):
    with nothing there it starts the run; on a finished run it reports the same stages."""
    recipe = runpy.run_path(str(ROOT / "recipes" / "offline_only.py"))
    args = ["--quick", "--quiet", "--cache-dir", "", "--out", str(tmp_path / "off"),
            "--resume", "--set", *[f"{k}={v}" for k, v in TINY.items()]]
    first = recipe["main"](args)
    again = recipe["main"](args)
    assert set(first["stages"]) == {"copier", "offline"}
    assert again["stages"]["offline"]["success_rate"] == first["stages"]["offline"][
        "success_rate"]


@pytest.mark.slow
def test_evaluation_recipe_writes_its_report(tmp_path, monkeypatch, capsys):
    out = tmp_path / "ev"
    monkeypatch.setattr(sys, "argv", [
        "evaluate.py", "--quick", "--policy", "sft", "--cache-dir", "", "--quiet",
        "--out", str(out), "--set", *[f"{k}={v}" for k, v in TINY.items()]])
    runpy.run_path(str(ROOT / "recipes" / "evaluate.py"), run_name="__main__")
    report = json.loads((out / "eval_eval.json").read_text())
    # the rate is the stored episodes' own: successes over the usable (judged) ones
    stored, _ = load_trajectories(out / "eval" / "eval")
    usable = [t for t in stored if t.is_usable]
    assert report["episodes"] == len(stored) == 4
    assert report["successes"] == sum(t.is_success for t in usable)
    assert report["success_rate"] == report["successes"] / len(usable)
    assert "held-out success" in capsys.readouterr().out


def test_tensorboard_scalars(tmp_path):
    optional_import("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = Trainer(sim_quick(**TINY, tensorboard=True), tmp_path / "tb", cache_dir=None,
                progress=False)
    t.log(stage="online", iteration=1, actor_loss=0.5, collect_success=0.25)
    t.log(stage="eval:online", success_rate=0.4)
    acc = EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"online/actor_loss", "online/collect_success", "eval/online/success_rate"} <= tags
    assert acc.Scalars("online/actor_loss")[0].value == pytest.approx(0.5)


@pytest.mark.slow
@pytest.mark.parametrize("world", ["webshop", "general"])
def test_the_shipped_starting_policy_matches_the_main_jobs_config(tmp_path, world):
    """The main job (recipes/configs/main.json, on either world) and the shipped world's
    preset (sim_webshop) load a shipped policy (policies/sft-<world>, or the paper setting's
    General start by its SFT key): it must have been built with their SFT settings, or the
    README's command fails. Rebuild with recipes/make_starting_policy.py --world <world>
    (with --config for the paper setting's) after changing them."""
    from digirl_lite.train.config import load_config, sim_webshop
    from digirl_lite.train.starting import shipped_policy_dir

    main = load_config(ROOT / "recipes" / "configs" / "main.json", world=world)
    for i, cfg in enumerate((main, sim_webshop(world=world))):
        ships = shipped_policy_dir(cfg)
        meta = json.loads((ships / "sft.json").read_text())
        assert meta["world"] == world
        t = Trainer(cfg, tmp_path / f"r{i}", cache_dir=None, progress=False)
        assert meta["key"] == t.sft_key()
        t.build_starting_policy()  # loads, and the policy answers
        out = t.policy.act(["Previous Actions: Goal: Go to costco.com</s>"],
                           np.zeros((1, t.policy.img_dim), dtype=np.float32),
                           temperature=0.0, max_new_tokens=32)
        assert out and isinstance(out[0], str)


@pytest.mark.slow  # a tiny SFT policy, two evaluations of 6 tasks
def test_constrained_decoding_reaches_every_sampled_action(tmp_path):
    """constrained_decoding=True: every action the Trainer's agent samples parses (none is
    INVALID, while the same tiny, barely trained policy writes many unparseable strings
    without it)."""
    from dataclasses import replace

    from digirl_lite.actions import parse_action

    t = Trainer(sim_quick(**{**TINY, "eval_tasks": 6, "max_new_tokens": 24}), tmp_path / "run",
                cache_dir=tmp_path / "cache")
    t.build_starting_policy()
    rates = {}
    for constrained in (False, True):
        t.cfg = replace(t.cfg, constrained_decoding=constrained)
        assert t.agent().constrained is constrained
        report = t.evaluate(f"c{constrained}")
        rates[constrained] = report["invalid_step_rate"]
        trajs, _ = load_trajectories(tmp_path / "run" / "eval" / f"c{constrained}")
        texts = [s.action_text for tr in trajs for s in tr.steps]
        assert texts
        if constrained:
            assert all(parse_action(x).is_valid for x in texts), texts[:3]
    assert rates[True] == 0.0 < rates[False]
