"""Fleets under faults (issue 29), on real served phones over the wire: a task a lost phone
could not finish runs on another phone; a phone whose starts keep failing leaves the fleet
with one line naming its URL, and rejoins when it answers again; with no phone left the
collection stops with every finished episode kept. No mocks: the phones are
``python -m digirl_lite.envs.sim.serve`` processes, killed with SIGKILL."""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

import pytest
from judge_servers import OpenAIServer
from needs import free_port
from phone_agents import Tapper, experts
from tiny_models import tiny_autoui_dir, tiny_blip2_dir, tiny_roberta_dir

from digirl_lite.data.records import Ending, ScreenTable
from digirl_lite.envs.setup import EndpointEnvFactory
from digirl_lite.envs.sim.serve import spawn_phones
from digirl_lite.rollout import ScriptedBatchAgent, make_fleet
from digirl_lite.rollout.fleet import NoDevicesLeft
from digirl_lite.train.evaluate import summarize

TASKS = [f"Go to {site}.com" for site in ("bestbuy", "ebay", "costco", "walmart", "newegg",
                                            "target")] * 2


class Saboteur:
    """The tapper on every phone; before its ``n``-th batch it runs ``plan[n]()`` (kills
    phones, restarts one): the faults land mid-collection, mid-episode."""

    def __init__(self, plan) -> None:
        self.agent, self.plan, self.calls = ScriptedBatchAgent(Tapper), plan, 0
        self.lock = threading.Lock()

    def act_batch(self, slots, observations):
        with self.lock:
            self.calls += 1
            if self.calls in self.plan:
                self.plan[self.calls]()
        return self.agent.act_batch(slots, observations)


@pytest.fixture
def phones():
    ps = spawn_phones(3, world="webshop", seed=0)
    yield ps
    for p in ps:
        p.close()


def _factory(urls):
    devices = [{"server_url": u, "settle_s": 0.0, "blank_wait_s": 0.05, "retry_wait_s": 0.05,
                "connect_retries": 1, "call_timeout_s": 10.0} for u in urls]
    return EndpointEnvFactory(devices, {"judge": "env"}, horizon=5, reset="task")


def _quarantine_lines(caplog):
    return [r.getMessage() for r in caplog.records if "left the fleet" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.parametrize("fleet", ["sync", "process", "async"])
def test_a_phone_lost_mid_collection_loses_no_task(fleet, phones, caplog):
    """The issue's lost phone: killed mid-collection, it no longer drains the queue. Every
    task is judged once (run on the live phones), the dead phone leaves with one line
    naming its URL, and the evaluation is complete."""
    caplog.set_level(logging.WARNING, logger="digirl_lite.rollout")
    agent = Saboteur({4: phones[1].kill})
    with make_fleet(fleet, _factory([p.url for p in phones]), 3, quarantine_after=2,
                    quarantine_probe_s=600) as f:
        episodes = f.collect(agent, TASKS, ScreenTable(), id_prefix="lost", seed=5)
    assert [e.trajectory.traj_id for e in episodes] == [f"lost-{k:05d}" for k in
                                                        range(len(TASKS))]
    endings = [e.trajectory.ending for e in episodes]
    assert endings == [Ending.AGENT_STOP] * len(TASKS), [
        e.trajectory.truncation_reason for e in episodes]
    s = f.stats
    assert s.quarantined == 1 and s.returned == 0 and s.requeued >= 1
    assert s.episodes == len(TASKS)
    (event,) = s.device_events
    assert event["event"] == "quarantined" and phones[1].url in event["device"]
    lines = _quarantine_lines(caplog)
    assert len(lines) == 1 and phones[1].url in lines[0]
    report = summarize(episodes)
    assert report["complete"] and report["judged_episodes"] == len(TASKS)
    assert report["not_evaluated"] == []


@pytest.mark.slow
@pytest.mark.parametrize("fleet", ["sync", "async"])
def test_a_restarted_phone_rejoins_the_fleet(fleet, phones):
    """A phone killed, then served again on its port: probed, it comes back."""
    port = int(phones[2].url.rsplit(":", 1)[1])
    reborn = []

    def restart():
        assert f.stats.quarantined == 1  # it left while it was down
        reborn.extend(spawn_phones(1, world="webshop", seed=2, ports=[port]))

    agent = Saboteur({3: phones[2].kill, 12: restart})
    try:
        with make_fleet(fleet, _factory([p.url for p in phones]), 3, quarantine_after=1,
                        quarantine_probe_s=0.2) as f:
            episodes = f.collect(agent, TASKS * 2, ScreenTable(), id_prefix="back", seed=5)
    finally:
        for p in reborn:
            p.close()
    assert reborn and reborn[0].url == phones[2].url
    assert all(e.trajectory.ending is Ending.AGENT_STOP for e in episodes)
    s = f.stats
    assert s.quarantined == 1 and s.returned == 1
    assert [e["event"] for e in s.device_events] == ["quarantined", "returned"]
    assert all(phones[2].url in e["device"] for e in s.device_events)


@pytest.mark.slow
@pytest.mark.parametrize("fleet", ["sync", "async"])
def test_no_phone_left_stops_with_what_finished(fleet, phones):
    """Every phone killed mid-collection: the fleet stops with :class:`NoDevicesLeft`, the
    finished episodes (all judged) kept on the exception, the reason naming each URL."""
    def kill_all():
        for p in phones:
            p.kill()

    # mid-collection: the sync fleet's batches are rounds of 3 phones, the async fleet's
    # mostly single phones; either way some episodes have finished, others are running
    agent = Saboteur({5 if fleet == "sync" else 14: kill_all})
    with make_fleet(fleet, _factory([p.url for p in phones]), 3, quarantine_after=1,
                    quarantine_probe_s=600) as f, pytest.raises(NoDevicesLeft) as err:
        f.collect(agent, TASKS, ScreenTable(), id_prefix="gone", seed=5)
    kept = err.value.episodes
    assert kept and all(e.trajectory.ending is Ending.AGENT_STOP for e in kept)
    assert len({e.trajectory.traj_id for e in kept}) == len(kept) < len(TASKS)
    assert all(p.url in err.value.reason for p in phones)
    assert f.stats.quarantined == 3


class _Down:
    """A phone that never starts (a dead device, in process)."""

    horizon = 5

    def reset(self, task=None, seed=None):
        raise ConnectionError("nothing answers")

    def close(self):
        pass


@pytest.mark.parametrize("fleet", ["sync", "async"])
def test_the_last_attempt_of_the_last_task_on_the_last_device_is_not_no_device_left(fleet):
    """Every task settled (its attempts used up) when the last device leaves: the
    collection returns its episodes, it does not report that no device was left; the next
    collection probes the quarantined device at once before giving up. The first failed
    start is the device's free one (one per device): it uses up no attempt."""
    with make_fleet(fleet, lambda slot: _Down(), 1, max_task_attempts=1, quarantine_after=2,
                    quarantine_probe_s=600) as f:
        episodes = f.collect(ScriptedBatchAgent(Tapper), TASKS[:1], ScreenTable(),
                             id_prefix="d")
        assert [e.trajectory.ending for e in episodes] == [Ending.INFRA]
        assert f.stats.quarantined == 1 and f.stats.requeued == 1
        t0 = time.monotonic()
        with pytest.raises(NoDevicesLeft, match="nothing answers"):
            f.collect(ScriptedBatchAgent(Tapper), TASKS[:2], ScreenTable(), id_prefix="e")
        assert time.monotonic() - t0 < 30  # probed at once, not after 600 s


@pytest.mark.parametrize("fleet", ["sync", "async"])
def test_a_dead_device_cannot_use_up_a_task_s_attempts(fleet):
    """Two dead devices not yet quarantined and one live: a task that fails to start on
    both dead ones (their free starts) still runs on the live one, with one attempt."""
    from digirl_lite.envs.sim import SimEnvFactory, SimPhoneEnv, Surprises

    live = SimEnvFactory(tasks="webshop_test", surprises=Surprises.none())
    tasks = SimPhoneEnv("webshop_test").tasks[:6]
    with make_fleet(fleet, lambda slot: _Down() if slot < 2 else live(slot), 3,
                    max_task_attempts=1, quarantine_after=3) as f:
        episodes = f.collect(ScriptedBatchAgent(Tapper), tasks, ScreenTable(), id_prefix="f")
    assert [e.trajectory.ending is Ending.INFRA for e in episodes] == [False] * 6
    assert f.stats.requeued >= 2  # each dead device failed at least one start


class _Hung(_Down):
    """A phone that hangs: every reset gives up after ``wait_s`` (a call timeout)."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s

    def reset(self, task=None, seed=None):
        time.sleep(self.wait_s)
        raise TimeoutError(f"no answer in {self.wait_s} s")


@pytest.mark.slow
def test_probing_a_hung_phone_does_not_hold_up_the_lockstep_fleet():
    """A quarantined phone that hangs is probed on a thread of its own: the live phone's
    episodes go on at their own pace (probed every round here, each probe 1.5 s)."""
    from digirl_lite.envs.sim import SimPhoneEnv, Surprises

    def make(slot):
        return _Hung(1.5) if slot == 1 else SimPhoneEnv("webshop_test",
                                                        surprises=Surprises.none())

    tasks = SimPhoneEnv("webshop_test").tasks[:8]
    expert = experts()
    with make_fleet("sync", make, 2, quarantine_after=1, quarantine_probe_s=0.0) as f:
        t0 = time.monotonic()
        episodes = f.collect(expert, tasks, ScreenTable(), id_prefix="h")
        took = time.monotonic() - t0
    assert all(e.trajectory.is_success for e in episodes)
    steps = sum(len(e.trajectory) for e in episodes)
    assert f.stats.quarantined == 1 and f.stats.returned == 0
    # serial probes would add 1.5 s to each of the live phone's steps (here about 1.5 s x
    # steps); on their own thread they cost a few probes' time in all
    assert took < 0.3 * 1.5 * steps, (took, steps)


# -- a judge that is down -------------------------------------------------------------------
def _paper(url: str, **kw) -> dict:
    return {"judge": "paper", "guards": False, **kw,
            "backend": {"backend": "openai", "model": "m", "base_url": url + "/v1",
                        "api_key_env": None}}


@pytest.mark.slow
def test_a_judge_that_is_down_is_refused_before_any_collection(tmp_path):
    """The issue's dead judge: a refused connection, an error status and a reply without a
    status each stop the run at its start, in seconds, with the URL and the answer."""
    from digirl_lite.errors import ConfigError
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=f"judge at {url}/v1 failed its probe"):
        Trainer(sim_quick(judge=_paper(url)), tmp_path / "a", cache_dir=None, progress=False)
    assert time.monotonic() - t0 < 10
    with OpenAIServer() as server:
        server.error(503, "model is loading")
        with pytest.raises(ConfigError, match="error 503.*model is loading"):
            Trainer(sim_quick(judge=_paper(server.url)), tmp_path / "b", cache_dir=None,
                    progress=False)
        server.reply("I cannot see the screen.")
        with pytest.raises(ConfigError, match="without a 'Status: success.*cannot see"):
            Trainer(sim_quick(judge=_paper(server.url)), tmp_path / "c", cache_dir=None,
                    progress=False)
        n = server.count
        Trainer(sim_quick(judge=_paper(server.url)), tmp_path / "d", cache_dir=None,
                progress=False).close()
        assert server.count == n + 1  # one request: the probe
        assert not (tmp_path / "d" / "store").exists()  # nothing collected


@pytest.mark.slow
@pytest.mark.parametrize("fleet", ["sync", "async"])
def test_a_judge_that_goes_down_mid_collection_stops_it_in_time(fleet, caplog):
    """The judge's server fails every request from mid-collection on: each backoff is one
    log line, and the collection stops after ``max_unjudged_s`` without a verdict (the step
    limit far off), with every finished episode kept."""
    from digirl_lite.envs.sim import SimEnvFactory, SimPhoneEnv, Surprises
    from digirl_lite.rollout.fleet import JudgeUnavailable

    caplog.set_level(logging.WARNING, logger="digirl_lite.judge")
    server = OpenAIServer().start()
    judge = _paper(server.url, max_attempts=3, backoff_s=0.2)
    make = SimEnvFactory(judge=judge, tasks="webshop_test", surprises=Surprises.none())
    tasks = SimPhoneEnv("webshop_test").tasks[:12]
    expert = experts()
    def down():  # every request from now on fails, as a server behind a proxy that died
        for _ in range(10_000):
            server.error(503, "upstream connect error")

    agent = Saboteur({6: down})
    t0 = time.monotonic()
    try:
        with make_fleet(fleet, make, 2, max_unjudged_steps=10_000, max_unjudged_s=3.0) as f, \
                pytest.raises(JudgeUnavailable) as err:
            agent.agent = expert
            f.collect(agent, tasks, ScreenTable(), id_prefix="j", seed=1)
    finally:
        server.stop()
    took = time.monotonic() - t0
    assert err.value.seconds is not None and 3.0 <= err.value.seconds < 10.0
    assert "no verdict for" in str(err.value) and took < 30
    assert all(e.trajectory.num_unjudged == 0 for e in err.value.episodes)
    retries = [r.getMessage() for r in caplog.records if "try 2 of 3" in r.getMessage()]
    assert retries and all(server.url in m for m in retries)


# -- the run: no phone left stops it with a checkpoint; --resume goes on ---------------------
@pytest.mark.slow
def test_a_run_with_no_phone_left_stops_with_a_checkpoint_and_resumes(tmp_path):
    """Every served phone killed inside the online phase: the recipe exits with the reason
    (no device left, each URL named) and a checkpoint; the phones served again on their
    ports, ``--resume`` runs to the end with nothing lost or stored twice, and the summary
    says which devices left the fleet."""
    import json
    import os
    import subprocess
    from collections import Counter

    from digirl_lite.data.store import load_trajectories

    root = Path(__file__).resolve().parents[2]
    phones = spawn_phones(3, world="webshop", seed=0)
    ports = [int(p.url.rsplit(":", 1)[1]) for p in phones]
    iterations, per_iteration = 3, 3
    cfg = {
        "env": "android",
        "android": {"devices": [{"server_url": p.url} for p in phones],
                    "options": {"settle_s": 0.0, "blank_wait_s": 0.05, "retry_wait_s": 0.05,
                                "connect_retries": 1, "call_timeout_s": 10.0},
                    "reset": "task"},
        "starting_policy": str(tiny_autoui_dir(tmp_path / "autoui", img_dim=32)),
        "image_encoder": str(tiny_blip2_dir(tmp_path / "blip2", hidden=32)[0]),
        "text_encoder": str(tiny_roberta_dir(tmp_path / "roberta", hidden=24)),
        "critic_hidden": 16, "judge": {"judge": "env"}, "quarantine_after": 1,
        "horizon": 5, "pile_size": 6, "iterations": iterations,
        "rollouts_per_iteration": per_iteration, "eval_tasks": 3, "max_new_tokens": 16,
        "offline_critic_updates": 2, "offline_actor_updates": 2, "actor_updates": 2,
        "critic_updates": 2, "actor_batch": 8, "critic_batch": 8,
    }
    cfg_path, out = tmp_path / "served.json", tmp_path / "run"
    cfg_path.write_text(json.dumps(cfg))

    def run(*extra):
        return subprocess.Popen(
            [sys.executable, str(root / "recipes" / "offline_to_online.py"), "--quick",
             "--quiet", "--config", str(cfg_path), "--out", str(out), "--cache-dir", "",
             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"})

    def online_done():
        p = out / "metrics.jsonl"
        rows = [json.loads(x) for x in p.read_text().splitlines()] if p.is_file() else []
        return max([r.get("iteration", 0) for r in rows if r.get("stage") == "online"],
                   default=0)

    try:
        proc = run()
        deadline = time.monotonic() + 600
        while online_done() < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in phones:
            p.kill()
        text = proc.communicate(timeout=300)[0].decode()
        assert proc.returncode != 0, text[-3000:]
        assert "run stopped" in text and "no device was left" in text, text[-3000:]
        assert all(p.url in text for p in phones)
        assert "--resume goes on from checkpoint" in text
        assert (out / "checkpoints" / "latest").is_file()
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        (stop,) = [r for r in rows if r.get("stage") == "stopped"]
        assert stop["no_devices"] and stop["fleet"]["quarantined"] == 3

        phones = spawn_phones(3, world="webshop", seed=0, ports=ports)
        proc = run("--resume")
        text = proc.communicate(timeout=600)[0].decode()
        assert proc.returncode == 0, text[-3000:]
    finally:
        for p in phones:
            p.close()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["online_trajectories"] == iterations * per_iteration
    assert summary["stages"]["online"]["complete"]
    trajs, _ = load_trajectories(out / "store")
    assert max(Counter(t.traj_id for t in trajs).values()) == 1  # nothing stored twice
    online = [t for t in trajs if t.traj_id.startswith("online-")]
    assert len(online) == iterations * per_iteration  # nothing lost
    for k in range(1, iterations + 1):  # each iteration whole, none from the stopped part
        assert sum(t.iteration == k for t in online) == per_iteration
        assert not any(t.is_infra_truncated for t in online)
    # the summary holds the whole run's history: the stopped attempt's three quarantines
    # (each device named), none in the resumed attempt
    fleet = summary["fleet"]
    assert fleet["quarantined"] == 3 and fleet["returned"] == 0
    assert sorted(e["device"].split("(")[1].rstrip(")") for e in fleet["device_events"]
                  if e["event"] == "quarantined") == sorted(p.url for p in phones)
