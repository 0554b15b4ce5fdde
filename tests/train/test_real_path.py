"""The real path's configuration: every component from the config, and every configuration
that cannot work refused with a ConfigError naming the field (or the device's URL) before
anything is collected; a judge that cannot answer stops the run, loudly, keeping its data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from judge_servers import OpenAIServer, openai_reply
from needs import free_port
from tiny_models import tiny_autoui_dir, tiny_blip2_dir, tiny_roberta_dir

from digirl_lite.data.records import Verdict
from digirl_lite.envs.judges import check_judge, make_judge
from digirl_lite.envs.setup import android_plan, make_phones
from digirl_lite.errors import ConfigError
from digirl_lite.judge import GeminiBackend, PaperJudge
from digirl_lite.paths import data_dir
from digirl_lite.train.config import DigiRLConfig, load_config, sim_quick, sim_webshop

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = data_dir() / "policies" / "sft-webshop"
PRESETS = {"sim_webshop": sim_webshop, "sim_quick": sim_quick, "paper": DigiRLConfig}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, tiny_blip2):
    """A tiny Auto-UI checkpoint reading 32-d image features, BLIP-2s of width 32 (the
    session's) and 16, and a RoBERTa of width 24."""
    root = tmp_path_factory.mktemp("tiny")
    return {"autoui": tiny_autoui_dir(root / "autoui", img_dim=32),
            "blip2": tiny_blip2[0],
            "blip2_16": tiny_blip2_dir(root / "blip2_16", hidden=16)[0],
            "roberta": tiny_roberta_dir(root / "roberta", hidden=24)}


# -- the shipped configs ---------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted((ROOT / "recipes" / "configs").glob("*.json")),
                         ids=lambda p: p.name)
def test_shipped_configs_load_paths_aside(path):
    """Every field of every shipped config (and of its per_world sections) is a DigiRLConfig
    field with a valid value, and its android section parses into the classes that read it
    (paths are the user's)."""
    from digirl_lite.train.config import _config_fields

    d = _config_fields(path)  # its own fields on those of its base file, if it has one
    per_world = d.pop("per_world", {})
    preset = PRESETS[d.pop("preset", "sim_webshop")]
    cfg = preset(**d)
    for world, fields in per_world.items():  # each world's fields on top
        preset(**{**d, **fields, "world": world})
    if cfg.env == "android":
        plan = android_plan(cfg.android)
        assert plan.n >= 1
        assert (plan.emulators is None) == bool(plan.devices)


def test_legacy_android_keys_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"unknown keys \['avd_name', 'n_devices', 'sdk_root'\]"):
        android_plan({"sdk_root": "~/Android/Sdk", "avd_name": "x", "n_devices": 16})
    with pytest.raises(ConfigError, match=r"android.emulators: unknown keys \['avd_name'\]"):
        android_plan({"emulators": {"avd_name": "x"}})
    with pytest.raises(ConfigError, match="exactly one of 'devices'"):
        android_plan({})
    with pytest.raises(ConfigError, match=r"android.devices\[1\]: unknown keys \['url'\]"):
        android_plan({"devices": ["http://127.0.0.1:1", {"url": "x"}]})
    with pytest.raises(ConfigError, match="'snapshot' needs 'emulators'"):
        android_plan({"devices": ["http://127.0.0.1:1"], "reset": "snapshot"})
    plan = android_plan({"devices": ["http://127.0.0.1:1", {"server_url": "http://h:2"}],
                         "options": {"settle_s": 0.0}})
    assert [d["server_url"] for d in plan.devices] == ["http://127.0.0.1:1", "http://h:2"]
    assert all(d["settle_s"] == 0.0 for d in plan.devices) and plan.reset == "home"


# -- judges that cannot work -------------------------------------------------------------------
def test_paper_judge_without_its_key_is_a_config_error(monkeypatch):
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    judge = {"judge": "paper", "backend": {"backend": "gemini"}}
    with pytest.raises(ConfigError, match="GEMINI_API_KEY is not set"):
        sim_quick(judge=judge).check_paths()
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    sim_quick(judge=judge).check_paths()  # with the key it passes


def test_paper_judge_without_its_extra_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", None)  # as if the judge extra were missing
    with pytest.raises(ConfigError, match=r"needs 'openai'.*digirl-lite\[judge\]"):
        check_judge({"judge": "paper", "backend": {"backend": "openai", "model": "m",
                                                   "api_key_env": None}})


def test_judges_that_need_what_the_environment_lacks():
    for kind in ("oracle", "noisy_oracle"):
        with pytest.raises(ConfigError, match="simulator's state"):
            check_judge({"judge": kind}, env="android")
    with pytest.raises(ConfigError, match="own success check"):
        check_judge({"judge": "env"}, env="android", android_reset="snapshot")
    with pytest.raises(ConfigError, match="unknown judge 'gpt'"):
        check_judge({"judge": "gpt"})
    check_judge({"judge": "env"}, env="sim")
    check_judge({"judge": "env"}, env="android", android_reset="task")


def test_missing_key_is_not_retried_and_keeps_its_message(monkeypatch):
    """The quick job with the Gemini judge and no key used to sit silent for minutes,
    retrying with backoff: now the first call says why, and the step is unjudged with it."""
    from digirl_lite.envs.sim import SimPhoneEnv

    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    slept: list[float] = []
    judge = PaperJudge(GeminiBackend(), sleep=slept.append, guards=False)
    env = SimPhoneEnv("webshop", judge=judge, seed=0)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("Action Plan: [PRESS_HOME]\nAction Decision: "
                                     '"action_type": "PRESS_HOME", "touch_point": '
                                     '"[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", '
                                     '"typed_text": ""')
    assert info["verdict"] is Verdict.UNJUDGED and reward == 0.0
    assert "GEMINI_API_KEY" in info["judge_skipped"]
    assert slept == [] and judge.calls == 0


def test_env_judge_is_the_simulators_ground_truth():
    from digirl_lite.envs.sim import ScriptedExpert, SimPhoneEnv

    env = SimPhoneEnv("webshop", judge=make_judge({"judge": "env"}), seed=3)
    obs, _ = env.reset(seed=3)
    expert = ScriptedExpert()
    verdicts = []
    for _ in range(env.horizon):
        obs, _, term, trunc, info = env.step(expert.act(obs))
        verdicts.append(info["verdict"])
        if term or trunc:
            break
    assert verdicts[-1] is Verdict.SUCCESS and info["success"]
    assert all(v is Verdict.FAILURE for v in verdicts[:-1])


# -- components from the config ----------------------------------------------------------------
def test_every_size_follows_the_loaded_policy(tiny_dirs, tmp_path):
    from digirl_lite.train.trainer import Trainer

    cfg = sim_quick(starting_policy=str(tiny_dirs["autoui"]), image_encoder=str(
        tiny_dirs["blip2"]), text_encoder=str(tiny_dirs["roberta"]), critic_hidden=20)
    t = Trainer(cfg, tmp_path / "run", cache_dir=None, progress=False)
    try:
        assert t.policy.img_dim == 32 and t.features.dim == 32 and t.screens.feature_dim == 32
        assert t.text.encoder.dim == 24  # the RoBERTa directory, not MiniLM
        head = t.step_critic.critic1
        assert head[0].in_features == 24 + 2 * 32  # text + the two screens' features
        assert head[0].out_features == 20  # critic_hidden
        assert t.instr_critic.critic.in_features == 24
    finally:
        t.close()


def test_encoder_width_mismatch_names_both_widths(tiny_dirs, tmp_path):
    from digirl_lite.train.trainer import Trainer

    cfg = sim_quick(starting_policy=str(tiny_dirs["autoui"]),
                    image_encoder=str(tiny_dirs["blip2_16"]))
    with pytest.raises(ConfigError, match=r"16-d features.*reads 32-d"):
        Trainer(cfg, tmp_path / "run", cache_dir=None, progress=False)
    assert not (tmp_path / "run" / "store").exists()


def test_unreachable_endpoint_is_refused_with_its_url(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    cfg = sim_quick(env="android", starting_policy=str(SHIPPED), judge={"judge": "env"},
                    android={"devices": [url], "options": {"call_timeout_s": 2.0}})
    with pytest.raises(ConfigError, match=f"android device {url} cannot be reached"):
        make_phones(cfg, seed=0)


def test_a_run_starts_without_the_endpoints_it_cannot_reach(tmp_path, caplog):
    """Issue 29: one endpoint of two down at the start is one warning line, and the fleet
    starts with it quarantined (it rejoins when a probe reaches it); all down is refused."""
    import logging

    from digirl_lite.envs.sim.serve import spawn_phones
    from digirl_lite.rollout import make_fleet

    caplog.set_level(logging.WARNING)
    (phone,) = spawn_phones(1, world="webshop", seed=0)
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        cfg = sim_quick(env="android", starting_policy=str(SHIPPED), judge={"judge": "env"},
                        android={"devices": [dead, phone.url],
                                 "options": {"call_timeout_s": 2.0}})
        phones = make_phones(cfg, seed=0)
        assert phones.down == (0,)
        lines = [r.getMessage() for r in caplog.records if dead in r.getMessage()]
        assert len(lines) == 1 and "starts without it" in lines[0]
        with make_fleet("sync", phones.make_env, phones.n, quarantined=phones.down) as f:
            assert [e["event"] for e in f.stats.device_events] == ["quarantined"]
            assert dead in f.stats.device_events[0]["device"]
    finally:
        phone.close()


def test_bad_config_file_fields_are_named(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"env": "android", "android": {"devices": []},
                             "judge": {"judge": "oracle"}}))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "android.devices: a non-empty list" in msg and "simulator's state" in msg


# -- a judge that cannot answer stops the run --------------------------------------------------
class _FailingAfter(OpenAIServer):
    """Answers well for the first ``good`` requests, then only replies without a status."""

    good = 0

    def default_body(self, rec):
        n = self.count
        text = "Q: q\nA: a\nStatus: failure" if n <= self.good else "I cannot tell."
        return openai_reply(text)


@pytest.mark.slow
def test_unjudged_steps_stop_the_run_with_the_reason_and_keep_the_data(tmp_path):
    from digirl_lite.data.store import load_trajectories
    from digirl_lite.train.trainer import RunStopped, Trainer

    server = _FailingAfter().start()
    server.good = 10**9
    try:
        judge = {"judge": "paper", "max_attempts": 1, "guards": False,
                 "backend": {"backend": "openai", "model": "m", "base_url": server.url + "/v1",
                             "api_key_env": None}}
        cfg = sim_quick(starting_policy=str(SHIPPED), judge=judge, pile_size=8, eval_tasks=2,
                        horizon=6,
                        n_envs=4, rollouts_per_iteration=4, iterations=2, max_unjudged_steps=6,
                        offline_critic_updates=2, offline_actor_updates=2, actor_updates=1)
        t = Trainer(cfg, tmp_path / "run", cache_dir=None, progress=False)
        t.build_starting_policy()
        t.evaluate("copier")
        assert t.summary["stages"]["copier"]["unjudged"] == 0
        server.good = server.count  # the judge dies now
        with pytest.raises(RunStopped) as e:
            t.build_pile()
        msg = str(e.value)
        assert "6 steps in a row were unjudged" in msg and "no 'Status: success|failure'" in msg
        assert "fix the judge and resume" in msg
        rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text()
                .splitlines()]
        stop = [r for r in rows if r.get("stage") == "stopped"]
        assert stop and stop[0]["during"] == "pile" and stop[0]["unjudged_in_a_row"] == 6
        assert ("kept in" in msg) == (stop[0]["kept_trajectories"] > 0)
        # kept aside, never in the run's store: a resume would take a part of the pile for
        # all of it (issue 29)
        assert not (tmp_path / "run" / "store").exists()
        if stop[0]["kept_trajectories"]:
            trajs, _ = load_trajectories(tmp_path / "run" / "stopped" / "pile-1")
            assert len(trajs) == stop[0]["kept_trajectories"]
        t.close()
    finally:
        server.stop()
