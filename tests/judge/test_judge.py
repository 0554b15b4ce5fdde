"""The judge: guards with the spec's numbers, the status parse, the paper judge's retry
logic, the noisy oracle, calibration, few-shot data and the calibrate CLI."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from PIL import Image

from digirl_lite.data import ReplayBuffer, Verdict, save_trajectories
from digirl_lite.envs.sim import SimPhoneEnv, Surprises
from digirl_lite.envs.sim.demos import generate_pile
from digirl_lite.envs.sim.oracle import NoisyOracleJudge, OracleJudge
from digirl_lite.envs.sim.world import Page, PhoneState
from digirl_lite.judge import (
    MSE_THRESHOLD,
    BackendError,
    BackendReply,
    FewShotSet,
    GuardedJudge,
    JudgeResult,
    PaperJudge,
    calibrate,
    is_blank,
    parse_status,
    screen_mse,
    wilson_interval,
)
from digirl_lite.paths import data_dir
from digirl_lite.rollout import run_episode

W, H = 1080, 2280
TASK = "Go to costco.com"


def screen(value: int = 120) -> np.ndarray:
    rng = np.random.default_rng(value)
    return rng.integers(0, 200, size=(H, W, 3), dtype=np.uint8)


def test_threshold_is_the_spec_number():
    assert MSE_THRESHOLD == pytest.approx(65.025)


def test_blinking_cursor_is_skipped_and_a_quarter_screen_popup_is_judged():
    base = np.full((H, W, 3), 30, dtype=np.uint8)
    cursor = base.copy()
    cursor.reshape(-1, 3)[:2000] += 200  # 2,000 px changed by 200 levels
    assert screen_mse(base, cursor) == pytest.approx(2000 * 200**2 / (W * H))  # 32.49, "32.5"
    assert round(screen_mse(base, cursor), 1) == 32.5
    popup = base.copy()
    popup.reshape(-1, 3)[: W * H // 4] += 100  # a quarter of the screen by 100 levels
    assert screen_mse(base, popup) == pytest.approx(2500.0)

    counting = CountingJudge()
    judge = GuardedJudge(counting)
    r = judge.judge(TASK, Image.fromarray(base), Image.fromarray(cursor))
    assert r.skipped and "unchanged" in r.skipped and r.verdict is Verdict.FAILURE
    assert counting.calls == 0
    r = judge.judge(TASK, Image.fromarray(base), Image.fromarray(popup))
    assert r.skipped is None and counting.calls == 1


def test_screen_mse_matches_the_float_formula_and_checks_sizes():
    a, b = screen(1), screen(2)
    ref = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    assert screen_mse(a, b) == pytest.approx(ref, rel=1e-12)
    assert screen_mse(Image.fromarray(a), Image.fromarray(b)) == pytest.approx(ref, rel=1e-12)
    with pytest.raises(ValueError, match="size"):
        screen_mse(a, a[:-1])


def test_blank_screen_guard_numbers():
    img = np.zeros((H, W, 3), dtype=np.uint8)
    flat = img.reshape(-1, 3)
    flat[:2_300_001] = 250
    assert is_blank(img)
    flat[:] = 0
    flat[:2_300_000] = 250  # not more than 2,300,000: not blank
    assert not is_blank(img)
    flat[:2_400_000] = 240  # 240 is not "> 240"
    assert not is_blank(img)


class CountingJudge:
    """A stand-in VLM that answers from a table and counts its calls."""

    def __init__(self, answer: Verdict = Verdict.FAILURE) -> None:
        self.answer = answer
        self.calls = 0

    def reset(self) -> None:
        pass

    def judge(self, task, prev, cur, *, history=None, state=None) -> JudgeResult:
        self.calls += 1
        return JudgeResult(self.answer, reply=f"Status: {self.answer.value}")


@pytest.mark.slow
def test_seen_recently_guard_remembers_five_screens_per_task():
    inner = CountingJudge()
    j = GuardedJudge(inner)
    screens = [Image.fromarray(screen(i)) for i in range(7)]
    prev = Image.fromarray(np.zeros((H, W, 3), dtype=np.uint8))
    for s in screens[:6]:
        j.judge(TASK, prev, s)
    assert inner.calls == 6
    # screens 1..5 are remembered (5 most recent); screen 0 was forgotten
    r = j.judge(TASK, prev, screens[5])
    assert r.skipped == "screen judged recently" and inner.calls == 6
    j.judge(TASK, prev, screens[0])
    assert inner.calls == 7
    # another task does not reuse this task's verdicts
    j.judge("Go to ebay.com", prev, screens[5])
    assert inner.calls == 8


def test_remembered_screen_keeps_its_verdict():
    inner = CountingJudge(Verdict.SUCCESS)
    j = GuardedJudge(inner)
    prev = Image.fromarray(np.zeros((H, W, 3), dtype=np.uint8))
    s = Image.fromarray(screen(3))
    assert j.judge(TASK, prev, s).verdict is Verdict.SUCCESS
    again = j.judge(TASK, prev, s)
    # the reference code answered reward 0 here (a false failure)
    assert again.verdict is Verdict.SUCCESS and again.skipped == "screen judged recently"


def test_guards_are_per_device():
    a_inner, b_inner = CountingJudge(), CountingJudge()
    a, b = GuardedJudge(a_inner), GuardedJudge(b_inner)
    prev = Image.fromarray(np.zeros((H, W, 3), dtype=np.uint8))
    s = Image.fromarray(screen(4))
    a.judge(TASK, prev, s)
    a.judge(TASK, prev, s)
    b.judge(TASK, prev, s)
    assert (a_inner.calls, b_inner.calls) == (1, 1)  # b's cache was not filled by a


@pytest.mark.parametrize(
    "reply, status",
    [
        ("Q: ...?\nA: I should expect to see ...\nStatus: success", "success"),
        ("Q: x\nA: y\nStatus: failure", "failure"),
        ("Status:success", "success"),
        ("Status:   Success.", "success"),
        ("status: success", None),  # the reference's regex is case-sensitive on 'Status'
        ("Status: unknown", None),
        ("Q: only a question", None),
        ("", None),
        (None, None),
        ("Status: failure\nStatus: success", "failure"),  # the first one counts
    ],
)
def test_parse_status(reply, status):
    assert parse_status(reply) == status


class ScriptedBackend:
    """A stand-in backend replaying planned replies or errors."""

    name = "scripted"

    def __init__(self, plan):
        self.plan = list(plan)
        self.requests = []

    def config(self):
        return {"backend": self.name}

    def generate(self, parts):
        self.requests.append(list(parts))
        item = self.plan.pop(0)
        if isinstance(item, BackendError):
            raise item
        return BackendReply(item, tokens=10)


def _paper(plan, **kw):
    delays = []
    backend = ScriptedBackend(plan)
    j = PaperJudge(backend, sleep=delays.append, seed=0, **kw)
    return j, backend, delays


def big(seed):
    return Image.fromarray(screen(seed))


def test_paper_judge_retries_then_succeeds():
    j, backend, delays = _paper([BackendError("429", True, 429), BackendError("500", True, 500),
                                 "Q: a\nA: b\nStatus: success"])
    r = j.judge(TASK, big(1), big(2))
    assert r.verdict is Verdict.SUCCESS and r.calls == 3 and r.tokens == 10
    assert len(delays) == 2 and delays[1] > delays[0]
    shot = [p for p in backend.requests[0] if isinstance(p, Image.Image)]
    assert shot[-1].size == (270, 570)  # 4x smaller per side


@pytest.mark.slow
def test_paper_judge_gives_unjudged_not_failure_after_exhaustion():
    j, backend, delays = _paper([BackendError("500", True, 500)] * 5)
    r = j.judge(TASK, big(1), big(2))
    assert r.verdict is Verdict.UNJUDGED and r.calls == 5 and "500" in r.skipped
    assert r.reward == 0.0 and j.unjudged == 1
    # unreadable replies are retried too, and end unjudged
    j2, _, _ = _paper(["no status here"] * 5)
    r2 = j2.judge(TASK, big(1), big(2))
    assert r2.verdict is Verdict.UNJUDGED and r2.calls == 5 and "Status" in r2.skipped
    # a non-retryable error stops at once
    j3, b3, _ = _paper([BackendError("401", False, 401)])
    assert j3.judge(TASK, big(1), big(2)).verdict is Verdict.UNJUDGED and len(b3.requests) == 1


@pytest.mark.slow
def test_paper_judge_guards_and_unjudged_screens_are_not_remembered():
    j, backend, _ = _paper([BackendError("500", True, 500)] * 5 + ["Status: failure"])
    s = big(2)
    assert j.judge(TASK, big(1), s).verdict is Verdict.UNJUDGED
    assert j.judge(TASK, big(1), s).verdict is Verdict.FAILURE  # asked again, not skipped
    assert len(backend.requests) == 6
    assert j.judge(TASK, big(1), s).skipped == "screen judged recently"
    assert j.judge(TASK, s, s).skipped.startswith("screen unchanged")
    assert len(backend.requests) == 6


def test_paper_judge_prompt_carries_examples():
    examples = FewShotSet.load(data_dir() / "judge_examples" / "webshop")
    j, backend, _ = _paper(["Status: success"], examples=examples)
    j.judge(TASK, big(1), big(2))
    parts = backend.requests[0]
    images = [p for p in parts if isinstance(p, Image.Image)]
    assert len(images) == len(examples) + 1 == 12
    text = "\n".join(p for p in parts if isinstance(p, str))
    assert "Status: success or failure (don't return anything else)" in text
    assert f"Task: {TASK}" in text
    assert sum(e.status == "success" for e in examples.examples) >= 3


def test_shipped_few_shot_sets():
    for world, n in (("webshop", 11), ("general", 9)):
        s = FewShotSet.load(data_dir() / "judge_examples" / world)
        assert len(s) == n
        assert {e.status for e in s.examples} == {"success", "failure"}
        for e in s.examples:
            assert e.answer.startswith("Q: What should I expect to see on the screenshot if I've")
            assert e.image().size == (270, 570)


def test_few_shot_set_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="labels"):
        FewShotSet.load(tmp_path)
    (tmp_path / "labels.jsonl").write_text(json.dumps(
        {"image": "a.png", "task": "t", "answer": "Status: success"}) + "\n")
    with pytest.raises(FileNotFoundError, match="a.png"):
        FewShotSet.load(tmp_path)
    Image.new("RGB", (10, 10)).save(tmp_path / "a.png")
    (tmp_path / "labels.jsonl").write_text(json.dumps(
        {"image": "a.png", "task": "t", "answer": "no status"}) + "\n")
    with pytest.raises(ValueError, match="Status"):
        FewShotSet.load(tmp_path)


def test_oracle_needs_the_state():
    with pytest.raises(TypeError, match="state"):
        OracleJudge().judge(TASK, None, big(1))


def _states(n):
    return [PhoneState(page=Page("chrome", "shop_results", site="costco", query=f"item {i}",
                                 order=tuple(range(8)))) for i in range(n)]


@pytest.mark.slow
def test_noisy_oracle_error_rates_and_determinism():
    noisy = NoisyOracleJudge(false_success_rate=0.1, false_failure_rate=0.3, seed=1)
    fail_task = 'Go to ebay.com, search for "x"'
    states = _states(3000)
    fs = [noisy.judge(fail_task, None, None, state=s).verdict is Verdict.SUCCESS
          for s in states]
    assert 0.08 < np.mean(fs) < 0.12
    ok = [noisy.judge(f'Go to costco.com, search for "item {i}"', None, None, state=s).verdict
          is Verdict.FAILURE for i, s in enumerate(states)]
    assert 0.27 < np.mean(ok) < 0.33
    # the same screen gets the same answer every time
    again = [noisy.judge(fail_task, None, None, state=s).verdict is Verdict.SUCCESS
             for s in states[:200]]
    assert again == fs[:200]
    exact = NoisyOracleJudge(0.0, 0.0)
    assert all(exact.judge(fail_task, None, None, state=s).verdict is Verdict.FAILURE
               for s in states[:50])
    with pytest.raises(ValueError):
        NoisyOracleJudge(1.5, 0.0)


def test_calibrate_on_a_known_confusion_matrix():
    preds = [1] * 8 + [0] * 2 + [1] * 3 + [0] * 87 + [None] * 4
    labels = [1] * 10 + [0] * 90 + [1] * 4
    r = calibrate(preds, labels, n_boot=500)
    assert r["confusion"] == {"tp": 8, "fp": 3, "fn": 2, "tn": 87}
    assert r["n"] == 100 and r["unjudged"] == 4
    assert r["accuracy"] == pytest.approx(0.95)
    assert r["precision"] == pytest.approx(8 / 11)
    assert r["recall"] == pytest.approx(0.8)
    assert r["f1"] == pytest.approx(16 / 21)
    assert r["false_success_rate"] == pytest.approx(3 / 90)
    assert r["false_failure_rate"] == pytest.approx(0.2)
    lo, hi = r["ci"]["f1"]
    assert lo < r["f1"] < hi
    for k in ("accuracy", "precision", "recall", "false_success_rate", "false_failure_rate"):
        lo, hi = r["ci"][k]
        assert lo <= r[k] <= hi
    # strings and verdicts work as labels and predictions
    r2 = calibrate([Verdict.SUCCESS, "failure", "unjudged"], ["success", "0", True])
    assert r2["confusion"] == {"tp": 1, "fp": 0, "fn": 0, "tn": 1} and r2["unjudged"] == 1
    with pytest.raises(ValueError):
        calibrate([1], [1, 0])
    with pytest.raises(ValueError):
        calibrate([1], ["maybe"])


def test_wilson_interval_reference_values():
    lo, hi = wilson_interval(8, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_unjudged_steps_keep_a_trajectory_out_of_training():
    class Flaky(CountingJudge):
        def judge(self, task, prev, cur, *, history=None, state=None):
            self.calls += 1
            if self.calls == 2:
                raise ConnectionError("judge API down")
            return JudgeResult(Verdict.FAILURE)

    env = SimPhoneEnv([TASK], judge=Flaky(), surprises=Surprises.none(), horizon=3)

    class Idle:
        def act(self, obs):
            return "junk"

    from digirl_lite.data import ScreenTable

    t = run_episode(env, Idle(), ScreenTable(), traj_id="flaky")
    assert [s.verdict for s in t.steps] == [Verdict.FAILURE, Verdict.UNJUDGED, Verdict.FAILURE]
    assert t.num_unjudged == 1 and not t.is_usable
    buf = ReplayBuffer()
    buf.add([t])
    assert buf.trajectories("all") == [] and buf.counts()["with_unjudged"] == 1


@pytest.mark.slow
def test_calibrate_cli_with_stored_verdicts(tmp_path, capsys):
    from digirl_lite.judge.__main__ import main

    trajs, screens, _ = generate_pile("general", n=12, seed=5)
    save_trajectories(tmp_path / "store", trajs, screens)
    labels = tmp_path / "labels.csv"
    with open(labels, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "label"])
        for i, t in enumerate(trajs):
            truth = t.is_success if i != 0 else not t.is_success  # one label disagrees
            w.writerow([t.traj_id, int(truth)])
    out = tmp_path / "report.json"
    main(["calibrate", "--store", str(tmp_path / "store"), "--labels", str(labels),
          "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["n"] == 12 and report["accuracy"] == pytest.approx(11 / 12)
    assert (tmp_path / "report.verdicts.jsonl").read_text().count("\n") == 12
    bad = tmp_path / "bad.csv"
    bad.write_text("id,label\nnot-a-trajectory,1\n")
    with pytest.raises(SystemExit, match="not in"):
        main(["calibrate", "--store", str(tmp_path / "store"), "--labels", str(bad)])


def test_make_judge_from_config(monkeypatch):
    from digirl_lite.envs.judges import make_judge
    from digirl_lite.judge import GeminiBackend, OpenAIBackend

    assert isinstance(make_judge(), OracleJudge)
    assert make_judge({"judge": "oracle"}) is not make_judge({"judge": "oracle"})
    noisy = make_judge({"judge": "noisy_oracle", "false_success_rate": 0.1, "seed": 3})
    assert isinstance(noisy, NoisyOracleJudge) and noisy.false_success_rate == 0.1
    guarded = make_judge({"judge": "noisy_oracle", "guards": True})
    assert isinstance(guarded, GuardedJudge)
    monkeypatch.setenv("GEMINI_API_KEY", "sk-secret-123")
    paper = make_judge({"judge": "paper", "examples": str(data_dir() / "judge_examples" /
                                                          "general"),
                        "backend": {"backend": "gemini", "model": "gemini-test"}})
    assert isinstance(paper, PaperJudge) and isinstance(paper.backend, GeminiBackend)
    assert len(paper.examples) == 9
    assert "sk-secret-123" not in json.dumps(paper.config())
    local = make_judge({"judge": "paper", "backend": {
        "backend": "openai", "model": "m", "base_url": "http://127.0.0.1:1/v1",
        "api_key_env": None}})
    assert isinstance(local.backend, OpenAIBackend)
    with pytest.raises(ValueError, match="unknown judge"):
        make_judge({"judge": "human"})
