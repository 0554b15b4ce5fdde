"""The served phone's observer reads and the always-right judge server built on them (issue
29's chaos run), with real served phones and the paper judge's real OpenAI client: its
verdicts are the phones' own checks, it never guesses, its faults reach the client as
faults; and an evaluation re-runs the episodes its judge left without a verdict."""

from __future__ import annotations

import json
import urllib.request

import pytest
from phone_agents import Tapper, TwinExpert

from digirl_lite.data.records import ScreenTable
from digirl_lite.envs.judges import make_judge, probe_judge
from digirl_lite.envs.setup import EndpointEnvFactory
from digirl_lite.envs.sim.judge_server import JudgeFaults, TruthJudgeServer
from digirl_lite.envs.sim.serve import spawn_phones
from digirl_lite.judge.backends import BackendError
from digirl_lite.rollout import ScriptedBatchAgent, make_fleet
from digirl_lite.train.evaluate import evaluate

TASKS = [f"Go to {site}.com" for site in ("bestbuy", "ebay", "costco", "walmart")]


@pytest.fixture(scope="module")
def phones():
    ps = spawn_phones(2, world="webshop", seed=0, surprises={"popup": 0.0, "blank": 0.0,
                                                              "voice": 0.0})
    yield ps
    for p in ps:
        p.close()


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["value"]


def _paper(url: str, **kw) -> dict:
    return {"judge": "paper", "guards": False, "max_attempts": 1, **kw,
            "backend": {"backend": "openai", "model": "truth", "base_url": url + "/v1",
                        "api_key_env": None, "timeout_s": 5.0}}


def _factory(urls, judge):
    devices = [{"server_url": u, "settle_s": 0.0, "blank_wait_s": 0.05, "retry_wait_s": 0.05,
                "connect_retries": 1, "call_timeout_s": 10.0} for u in urls]
    return EndpointEnvFactory(devices, judge, horizon=6, reset="task")


@pytest.mark.slow
def test_an_observer_reads_a_phone_without_taking_its_session(phones):
    """``GET /digirl/state`` and ``.../screenshot`` need no session, leave the client's in
    place and capture nothing: the client's next command still works, the screenshot read
    back is the last one the client got."""
    make = _factory([phones[0].url], {"judge": "env"})
    env = make(0)
    try:
        env.reset("Go to ebay.com", seed=3)
        state = _get(phones[0].url + "/digirl/state")
        assert state["task"] == "Go to ebay.com" and state["success"] is False
        assert state["session"] is True and state["screenshots"] >= 1
        shown = _get(phones[0].url + "/digirl/state/screenshot")
        assert isinstance(shown, str) and len(shown) > 100
        again = _get(phones[0].url + "/digirl/state")
        assert again["screenshots"] == state["screenshots"]  # reading captured nothing
        obs, _, _, _, info = env.step(Tapper(0).act(env._obs))  # the session still works
        assert obs.step == 1 and info["truncation"] is None
    finally:
        env.close()


@pytest.mark.slow
def test_the_truth_judge_answers_with_the_phone_s_own_check(phones):
    """The paper judge over the OpenAI protocol gets, step by step, the verdict the phone's
    ``isSuccess`` gives: the expert's episodes end on a judged success after judged
    failures, the tapper's are judged failures throughout, exactly as the environment's own
    check judges the same episodes; the probe's example screen is answered."""
    urls = [p.url for p in phones]
    runs = {}
    with TruthJudgeServer(urls) as server:
        judge = _paper(server.url)
        probe_judge(judge)  # the shipped example screen: a well-formed answer
        for name, judge_cfg in (("truth", judge), ("env", {"judge": "env"})):
            with make_fleet("sync", _factory(urls, judge_cfg), 2) as fleet:
                runs[name] = [e.trajectory for agent in (TwinExpert, Tapper)
                              for e in fleet.collect(ScriptedBatchAgent(agent), TASKS,
                                                     ScreenTable(), id_prefix="t", seed=5)]
        assert server.counts["unplaced"] == 0
    truth, env = runs["truth"], runs["env"]
    assert [t.is_success for t in truth] == [True] * 4 + [False] * 4
    assert [[s.reward for s in t.steps] for t in truth] == \
        [[s.reward for s in t.steps] for t in env]
    assert all(t.num_unjudged == 0 for t in truth)


@pytest.mark.slow
def test_two_phones_on_one_task_are_told_apart_by_the_screen(phones):
    """Both phones on the same task, one at the goal and one not: each request gets its own
    phone's verdict (the screens decide), not the other's."""
    urls = [p.url for p in phones]
    envs = [_factory([u], {"judge": "env"})(0) for u in urls]
    try:
        for env in envs:
            env.reset("Go to ebay.com", seed=1)
        expert = TwinExpert(0)
        obs = envs[0]._obs
        for _ in range(6):  # the expert opens the site on phone 0 only
            obs, _, _, _, info = envs[0].step(expert.act(obs))
            if info["success"]:
                break
        assert _get(urls[0] + "/digirl/state")["success"] is True
        assert _get(urls[1] + "/digirl/state")["success"] is False
        server = TruthJudgeServer(urls)
        for env, want in ((envs[0], "success"), (envs[1], "failure")):
            from digirl_lite.judge.guards import shrink

            verdict, why = server.verdict("Go to ebay.com", shrink(env._obs.screenshot, 270))
            assert verdict == want, why
    finally:
        for env in envs:
            env.close()


@pytest.mark.slow
def test_the_truth_judge_never_guesses_and_its_faults_reach_the_client(phones):
    """A task no phone is on is a 503 (a judge fault the client retries), never a verdict;
    injected drops and errors are retryable faults; down refuses connections, up answers
    again on the same port."""
    server = TruthJudgeServer([p.url for p in phones]).up()
    backend = make_judge(_paper(server.url)).backend
    from PIL import Image

    parts = ["intro", Image.new("RGB", (270, 570)), "Task: Go to nowhere.com\nRespond"]
    try:
        with pytest.raises(BackendError, match="503.*no phone") as e:
            backend.generate(parts)
        assert e.value.retryable and server.counts["unplaced"] == 1
        server.faults = JudgeFaults(drop=1.0)
        with pytest.raises(BackendError) as e:
            backend.generate(parts)
        assert e.value.retryable and server.counts["dropped"] == 1
        server.faults = JudgeFaults(error=1.0)
        with pytest.raises(BackendError, match="503.*injected") as e:
            backend.generate(parts)
        assert e.value.retryable
        server.faults = JudgeFaults()
        port = server.port
        server.down()
        with pytest.raises(BackendError, match="APIConnectionError"):
            backend.generate(parts)
        server.up()
        assert server.port == port
        with pytest.raises(BackendError, match="503.*no phone"):  # answering again
            backend.generate(parts)
    finally:
        server.down()


@pytest.mark.slow
def test_an_evaluation_reruns_the_episodes_its_judge_left_unjudged(phones):
    """A judge that fails a share of its requests (one try each): every evaluation task
    still ends judged, the episodes with an unjudged step having been run again."""
    urls = [p.url for p in phones]
    with TruthJudgeServer(urls, faults=JudgeFaults(error=0.1), seed=3) as server:
        make = _factory(urls, _paper(server.url))
        with make_fleet("sync", make, 2, max_task_attempts=30) as fleet:
            report, eps = evaluate(fleet, ScriptedBatchAgent(Tapper), TASKS * 2,
                                   n_tasks=None, id_prefix="e")
            requeued = fleet.stats.requeued_unjudged
    assert server.counts["errors"] > 0
    assert report["judged_episodes"] == report["episodes"] == 8, report["not_evaluated"]
    assert report["unjudged"] == 0 and report["complete"]
    assert requeued > 0 and fleet.stats.requeued >= requeued
    assert sorted(e.trajectory.traj_id for e in eps) == [f"e-{k:05d}" for k in range(8)]


@pytest.mark.slow
def test_a_phone_restarted_mid_episode_ends_the_episode_as_an_infrastructure_fault():
    """The phone is killed and served again on its port between two steps: the client's
    reconnect opens a new session on a phone that lost the episode's state (no task, on
    the launcher). The episode ends there as an infrastructure truncation naming the lost
    session; it does not go on, judged on a screen the agent never reached."""
    from digirl_lite.envs.base import TRUNCATION_INFRA

    (phone,) = spawn_phones(1, world="webshop", seed=0)
    port = int(phone.url.rsplit(":", 1)[1])
    env = _factory([phone.url], {"judge": "env"})(0)
    try:
        obs, _ = env.reset("Go to ebay.com", seed=2)
        obs, _, _, trunc, info = env.step(Tapper(0).act(obs))
        assert not trunc and info["truncation"] is None
        phone.kill()
        (phone,) = spawn_phones(1, world="webshop", seed=0, ports=[port])
        assert _get(phone.url + "/digirl/state")["task"] is None  # the state is gone
        obs, reward, term, trunc, info = env.step(Tapper(0).act(obs))
        assert trunc and not term and reward == 0.0
        assert info["truncation"] == TRUNCATION_INFRA
        assert "session was lost mid-episode" in info["reason"]
    finally:
        env.close()
        phone.close()
