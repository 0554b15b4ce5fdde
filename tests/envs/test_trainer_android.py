"""The Trainer on Android devices over Appium, end to end, without an SDK: four simulated
phones served over the WebDriver/Appium protocol in their own processes, a starting policy
from a tiny checkpoint in Auto-UI's layout, a tiny BLIP-2, tiny RoBERTa critics, and the
paper's judge over the OpenAI protocol to a local server. Pile, offline phase, online
iterations; then kill -9 in the middle of an iteration and ``--resume``: no trajectory lost
or duplicated, and the store holds the screenshots the devices sent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from judge_servers import OpenAIServer, openai_reply
from phone_agents import Tapper
from tiny_models import tiny_autoui_dir, tiny_blip2_dir, tiny_roberta_dir

from digirl_lite.data.store import load_trajectories
from digirl_lite.judge.guards import is_blank
from digirl_lite.rollout.episode import RECORD_SIZE

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "offline_to_online.py"

pytestmark = [pytest.mark.slow, pytest.mark.android]


class TaskAwareJudge(OpenAIServer):
    """A VLM judge's stand-in over the OpenAI protocol: success on every 5th call, failure
    otherwise (the verdicts only need to vary for the critics and filters to have data; the
    guards are off so that every step asks it)."""

    def default_body(self, rec):
        return openai_reply("Q: q\nA: a\nStatus: " + ("success" if self.count % 5 == 0
                                                       else "failure"))


def _run(cfg_path: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(RECIPE), "--quick", "--quiet", "--config", str(cfg_path),
         "--out", str(out), "--cache-dir", "", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _online_done(out: Path) -> int:
    p = out / "metrics.jsonl"
    if not p.is_file():
        return 0
    rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    return max([r.get("iteration", 0) for r in rows if r.get("stage") == "online"], default=0)


@pytest.fixture(scope="module")
def phones():
    from digirl_lite.envs.sim.serve import spawn_phones

    ps = spawn_phones(4, world="webshop", seed=0)
    yield ps
    for p in ps:
        p.close()


@pytest.fixture(scope="module")
def judge_server():
    s = TaskAwareJudge().start()
    yield s
    s.stop()


def test_trainer_on_served_phones_resumes_after_kill(tmp_path, phones, judge_server):
    autoui = tiny_autoui_dir(tmp_path / "autoui", img_dim=32)
    blip2 = tiny_blip2_dir(tmp_path / "blip2", hidden=32)[0]
    roberta = tiny_roberta_dir(tmp_path / "roberta", hidden=24)
    iterations, per_iteration, pile = 3, 4, 8
    cfg = {
        "env": "android",
        "android": {"devices": [{"server_url": p.url} for p in phones],
                    "options": {"settle_s": 0.0, "blank_wait_s": 0.05, "retry_wait_s": 0.1,
                                "call_timeout_s": 30.0},
                    "reset": "task"},
        "starting_policy": str(autoui), "image_encoder": str(blip2),
        "text_encoder": str(roberta), "critic_hidden": 16,
        "judge": {"judge": "paper", "max_attempts": 2, "backoff_s": 0.01, "guards": False,
                  "backend": {"backend": "openai", "model": "tiny-vlm",
                              "base_url": judge_server.url + "/v1", "api_key_env": None}},
        "horizon": 5, "pile_size": pile, "iterations": iterations,
        "rollouts_per_iteration": per_iteration, "eval_tasks": 4, "max_new_tokens": 16,
        "offline_critic_updates": 2, "offline_actor_updates": 2, "actor_updates": 2,
        "critic_updates": 2, "actor_batch": 8, "critic_batch": 8,
    }
    cfg_path = tmp_path / "android.json"
    cfg_path.write_text(json.dumps(cfg))
    out = tmp_path / "run"

    # first attempt: kill -9 once iteration 1 is done (so inside iteration 2)
    proc = _run(cfg_path, out)
    deadline = time.monotonic() + 600
    while _online_done(out) < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
    time.sleep(1.0)  # somewhere inside iteration 2
    os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group
    proc.wait()
    proc.stdout.close()
    assert not (out / "summary.json").exists()

    # resume to the end
    proc = _run(cfg_path, out, "--resume")
    text = proc.communicate(timeout=600)[0].decode()
    assert proc.returncode == 0, text[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["online_trajectories"] == iterations * per_iteration
    assert set(summary["stages"]) == {"copier", "offline", "online"}
    assert summary["unjudged_step_rate"].get("online", 0.0) == 0.0

    trajs, screens = load_trajectories(out / "store")
    ids = Counter(t.traj_id for t in trajs)
    assert max(ids.values()) == 1  # nothing stored twice
    online = [t for t in trajs if t.traj_id.startswith("online-")]
    assert len([t for t in trajs if t.traj_id.startswith("pile-")]) == pile
    assert len(online) == iterations * per_iteration  # nothing lost
    for k in range(1, iterations + 1):
        assert sum(t.iteration == k for t in online) == per_iteration
    # the judge over the wire gave the verdicts; the steps carry them
    verdicts = Counter(s.verdict.value for t in trajs for s in t.steps if s.verdict)
    assert verdicts["success"] > 0 and verdicts["failure"] > 0
    assert judge_server.count > 0

    # the screenshots the devices sent: every episode starts on the served phone's launcher,
    # which is the simulator's launcher at the recorded size
    from PIL import Image

    from digirl_lite.envs.sim import SimPhoneEnv

    home = SimPhoneEnv("webshop").reset(seed=0)[0].screenshot.resize(RECORD_SIZE,
                                                                       Image.BILINEAR)
    first = screens.image(online[0].steps[0].screen_id)
    assert first.size == RECORD_SIZE
    assert np.array_equal(np.asarray(first), np.asarray(home))
    assert screens.features([online[0].steps[0].screen_id]).shape == (1, 32)


@pytest.mark.parametrize("fleet", ["sync", "process", "async",
                                   pytest.param("ray", marks=pytest.mark.ray)])
def test_every_fleet_drives_android_devices(fleet, phones):
    """Each fleet collects over the wire: episodes end by the agent, each step judged by
    the device's own success check, screenshots from the served phones."""
    from digirl_lite.data.records import Ending, ScreenTable, Verdict
    from digirl_lite.envs.setup import EndpointEnvFactory
    from digirl_lite.rollout import ScriptedBatchAgent, make_fleet

    devices = [{"server_url": p.url, "settle_s": 0.0, "blank_wait_s": 0.05}
               for p in phones[:2]]
    make = EndpointEnvFactory(devices, {"judge": "env"}, horizon=5, reset="task")
    opts = {"num_cpus": 2} if fleet == "ray" else {}
    tasks = ["Go to bestbuy.com", "Go to ebay.com", "Go to costco.com", "Go to walmart.com"]
    screens = ScreenTable()
    with make_fleet(fleet, make, 2, **opts) as f:
        episodes = f.collect(ScriptedBatchAgent(Tapper), tasks, screens, id_prefix=fleet,
                             seed=5)
    assert [e.trajectory.task for e in episodes] == tasks
    for e in episodes:
        t = e.trajectory
        assert t.ending is Ending.AGENT_STOP and len(t) == 3, (t.ending, t.truncation_reason)
        assert all(s.verdict is Verdict.FAILURE for s in t.steps)
    first = screens.image(episodes[0].trajectory.steps[0].screen_id)  # a served launcher
    assert first.size == RECORD_SIZE and not is_blank(first)
