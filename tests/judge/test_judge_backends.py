"""The judge's VLM backends (Gemini ``generateContent``, OpenAI-compatible chat completions)
and the paper's judge on top of them, end to end through the real client libraries against
local scripted HTTP servers (tests/judge_servers.py): the wire format, key handling, error
classification, one request per call, and the judge's retries, backoff and verdicts.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
import traceback

import numpy as np
import pytest
from judge_servers import (
    GeminiServer,
    OpenAIServer,
    Planned,
    Recorded,
    ServerCase,
    request_parts,
)
from needs import free_port
from PIL import Image

from digirl_lite.data import Verdict
from digirl_lite.judge.backends import (
    BackendError,
    BackendReply,
    GeminiBackend,
    OpenAIBackend,
)

SECRET = "sk-test-SECRET-123"
CLIENT_LOGGERS = ("openai", "httpx", "httpcore", "httpx2", "httpcore2", "google_genai",
                  "google.genai", "urllib3")


# ---------------------------------------------------------------------------------------
# fixtures and helpers
# ---------------------------------------------------------------------------------------

pytestmark = pytest.mark.usefixtures("no_judge_keys")


@pytest.fixture
def gemini_server():
    with GeminiServer() as s:
        yield s


class Case(ServerCase):
    """One backend kind against its server: builds backends, reads requests back."""

    def make(self, port: int | None = None, **kw):
        if self.kind == "gemini":
            return GeminiBackend(model="gemini-test", base_url=self.url(port), **kw)
        return OpenAIBackend(model="qwen-vl", base_url=self.url(port), **kw)

    def sent_key(self, rec: Recorded) -> str | None:
        if self.kind == "gemini":
            return rec.header("x-goog-api-key")
        auth = rec.header("Authorization")
        return auth[len("Bearer "):] if auth and auth.startswith("Bearer ") else auth


@pytest.fixture(params=["gemini", "openai"])
def case(request, monkeypatch):
    server = GeminiServer() if request.param == "gemini" else OpenAIServer()
    with server:
        yield Case(request.param, server, monkeypatch, SECRET)


def pattern_image(w: int, h: int, seed: int = 0) -> Image.Image:
    """Distinct pixels everywhere, so any resampling or channel mix-up shows."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def quadrant_image(w: int = 1080, h: int = 2280) -> Image.Image:
    """Four flat colour blocks: their colours survive a shrink at the blocks' centres."""
    a = np.zeros((h, w, 3), np.uint8)
    a[: h // 2, : w // 2] = (255, 0, 0)
    a[: h // 2, w // 2:] = (0, 255, 0)
    a[h // 2:, : w // 2] = (0, 0, 255)
    a[h // 2:, w // 2:] = (250, 250, 20)
    return Image.fromarray(a, "RGB")


QUADRANT_COLOURS = {(0.25, 0.25): (255, 0, 0), (0.75, 0.25): (0, 255, 0),
                    (0.25, 0.75): (0, 0, 255), (0.75, 0.75): (250, 250, 20)}


def same_pixels(a: Image.Image, b: Image.Image) -> bool:
    return a.size == b.size and a.convert("RGB").tobytes() == b.convert("RGB").tobytes()


# ---------------------------------------------------------------------------------------
# wire format
# ---------------------------------------------------------------------------------------

def test_gemini_request_and_reply(gemini_server, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", SECRET)
    img = pattern_image(37, 23, seed=1)
    gemini_server.reply("Q: q?\nA: a.\nStatus: failure", prompt_tokens=40, reply_tokens=9)
    b = GeminiBackend(model="gemini-test", base_url=gemini_server.url)
    out = b.generate(["some text", img, "more text"])

    assert out == BackendReply(text="Q: q?\nA: a.\nStatus: failure", tokens=49)
    assert gemini_server.count == 1
    rec = gemini_server.requests[0]
    assert rec.method == "POST"
    assert rec.path.split("?")[0].endswith("/models/gemini-test:generateContent")
    assert rec.header("x-goog-api-key") == SECRET
    assert SECRET not in rec.path  # the key travels in a header, not in the URL
    assert len(rec.json["contents"]) == 1
    parts = request_parts("gemini", rec)
    assert [k for k, _ in parts] == ["text", "image", "text"]
    assert parts[0][1] == "some text" and parts[2][1] == "more text"
    assert same_pixels(parts[1][1], img)
    assert rec.json["generationConfig"]["temperature"] == 0.0


def test_openai_request_and_reply(openai_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    img = pattern_image(41, 19, seed=2)
    openai_server.reply("Status: success", prompt_tokens=30, reply_tokens=4)
    b = OpenAIBackend(model="qwen-vl", base_url=openai_server.url + "/v1")
    out = b.generate(["some text", img, "more text"])

    assert out == BackendReply(text="Status: success", tokens=34)
    assert openai_server.count == 1
    rec = openai_server.requests[0]
    assert rec.method == "POST" and rec.path == "/v1/chat/completions"
    assert rec.header("Authorization") == f"Bearer {SECRET}"
    assert rec.json["model"] == "qwen-vl"
    assert rec.json["temperature"] == 0.0 and rec.json["max_tokens"] == 512
    content = rec.json["messages"][0]["content"]
    assert [p["type"] for p in content] == ["text", "image_url", "text"]
    parts = request_parts("openai", rec)
    assert parts[0][1] == "some text" and parts[2][1] == "more text"
    assert same_pixels(parts[1][1], img)


def test_non_rgb_images_are_sent_as_rgb_png(case):
    rgba = pattern_image(8, 6, seed=3).convert("RGBA")
    grey = pattern_image(5, 7, seed=4).convert("L")
    case.make().generate([rgba, grey])
    imgs = [v for k, v in case.parts(case.server.requests[0]) if k == "image"]
    assert len(imgs) == 2
    assert same_pixels(imgs[0], rgba.convert("RGB"))
    assert same_pixels(imgs[1], grey.convert("RGB"))


def test_reply_without_usage_has_no_tokens(case):
    body = case.server.reply_body("Status: success")
    body.pop("usageMetadata" if case.kind == "gemini" else "usage")
    case.server.plan(Planned(200, body))
    assert case.make().generate(["x"]) == BackendReply("Status: success", None)


# ---------------------------------------------------------------------------------------
# the API key: where it goes, where it never goes
# ---------------------------------------------------------------------------------------

def test_key_sent_in_header_and_never_leaked(case, caplog):
    caplog.set_level(logging.DEBUG)
    for name in CLIENT_LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    b = case.make()
    b.generate(["hello", pattern_image(4, 4)])
    assert case.sent_key(case.server.requests[0]) == SECRET  # the key was really in play

    case.server.error(401, "API key not valid. Please pass a valid API key.")
    with pytest.raises(BackendError) as ei:
        b.generate(["again"])
    assert case.sent_key(case.server.requests[1]) == SECRET

    # not on the object's public faces, before or after the client exists
    assert SECRET not in repr(b) and SECRET not in str(b)
    assert SECRET not in str(b.config())
    assert SECRET not in json.dumps(b.config())
    assert b.config()["api_key_env"] == case.key_env
    # not in the error, nor in its printed traceback
    e = ei.value
    assert SECRET not in str(e) and SECRET not in repr(e)
    assert SECRET not in "".join(traceback.format_exception(e))
    # not in any log record (the logs were captured: the check is not vacuous)
    assert caplog.records, "no log records captured at DEBUG"
    assert SECRET not in caplog.text
    for r in caplog.records:
        assert SECRET not in r.getMessage()
        assert SECRET not in repr(vars(r))


def test_custom_key_env_is_the_one_used(case, monkeypatch):
    monkeypatch.setenv("DIGIRL_JUDGE_KEY", "other-key-456")
    case.make(api_key_env="DIGIRL_JUDGE_KEY").generate(["x"])
    assert case.sent_key(case.server.requests[0]) == "other-key-456"


def test_missing_key_env_raises_before_any_request(case, monkeypatch):
    monkeypatch.delenv(case.key_env)
    if case.kind == "gemini":
        # google-genai would fall back to this one by itself: the backend must not
        monkeypatch.setenv("GOOGLE_API_KEY", "fallback-key-789")
    b = case.make()
    with pytest.raises(RuntimeError, match=case.key_env) as ei:
        b.generate(["x"])
    assert not isinstance(ei.value, BackendError)
    assert case.server.count == 0
    # setting it later works with the same object (no failed client kept)
    monkeypatch.setenv(case.key_env, SECRET)
    assert b.generate(["x"]).text.endswith("Status: success")
    assert case.server.count == 1
    assert case.sent_key(case.server.requests[0]) == SECRET


def test_openai_without_key_env(openai_server, monkeypatch):
    b = OpenAIBackend(model="qwen-vl", base_url=openai_server.url + "/v1", api_key_env=None)
    assert b.generate(["x"]).text.endswith("Status: success")
    # a user's OpenAI key in the environment is not sent to a keyless (local) server
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    b2 = OpenAIBackend(model="qwen-vl", base_url=openai_server.url + "/v1", api_key_env=None)
    assert b2.generate(["x"]).text.endswith("Status: success")
    assert openai_server.count == 2
    for rec in openai_server.requests:
        assert SECRET not in str(rec.headers)


# ---------------------------------------------------------------------------------------
# errors: classification, one request per call, timeouts, lost connections
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("status,retryable", [
    (429, True), (500, True), (503, True),
    (400, False), (401, False), (403, False), (404, False),
])
def test_http_errors(case, status, retryable):
    case.server.error(status)
    b = case.make()
    with pytest.raises(BackendError) as ei:
        b.generate(["x", pattern_image(3, 3)])
    assert ei.value.status == status
    assert ei.value.retryable is retryable
    assert str(status) in str(ei.value)
    time.sleep(0.05)  # a client retry would land here
    assert case.server.count == 1, "the client retried on its own"
    assert case.server.pending == 0


def test_timeout_is_retryable_and_fast(case):
    # the server holds its reply for 60 s (until teardown): without the 0.5 s timeout the call
    # would wait for it and succeed; with it, the client gives up before the server answers
    case.server.sleep(60.0)
    b = case.make(timeout_s=0.5)
    with pytest.raises(BackendError) as ei:
        b.generate(["x"])
    assert case.server.count == 1 and case.server.answered == 0, "the call did not time out"
    assert re.search(r"time(d )?out", str(ei.value), re.IGNORECASE), str(ei.value)
    assert ei.value.retryable is True and ei.value.status is None
    # the next call gets through (the backend is still usable)
    assert b.generate(["x"]).text.endswith("Status: success")
    assert case.server.count == 2 and case.server.answered == 1


def test_closed_port_is_retryable(case, monkeypatch):
    # the clients back off with time.sleep between their own retries: none may happen (the
    # judge retries, not the client), so a refused connection is one attempt and no sleep
    sleeps = []
    monkeypatch.setattr(time, "sleep", sleeps.append)
    b = case.make(port=free_port(), timeout_s=5)
    with pytest.raises(BackendError) as ei:
        b.generate(["x"])
    assert sleeps == [], f"the client retried on its own after {sleeps}"
    assert ei.value.retryable is True and ei.value.status is None


@pytest.mark.parametrize("kind", ["gemini", "openai"])
def test_malformed_body_is_a_retryable_backend_error(kind, request, monkeypatch):
    server = request.getfixturevalue(f"{kind}_server")
    c = Case(kind, server, monkeypatch, SECRET)
    server.malformed(b"{not json")
    with pytest.raises(BackendError) as ei:
        c.make().generate(["x"])
    assert ei.value.retryable is True
    assert server.count == 1


def test_import_is_lazy():
    code = (
        "import sys\n"
        "import digirl_lite.judge.backends as b\n"
        "import digirl_lite.judge\n"
        "g = b.GeminiBackend(model='m'); o = b.OpenAIBackend(model='m')\n"
        "repr(g); repr(o); g.config(); o.config()\n"
        "from digirl_lite.judge import PaperJudge\n"
        "PaperJudge(g); PaperJudge(o)\n"
        "print([m for m in ('google.genai', 'openai', 'httpx', 'httpx2') "
        "if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


# ---------------------------------------------------------------------------------------
# the paper's judge, end to end through both backends
# ---------------------------------------------------------------------------------------

import digirl_lite.judge.paper as paper  # noqa: E402 - a plain import: an error here fails

SUCCESS_REPLY = ("Q: What should I expect to see on the screenshot if I've searched for "
                 "'weather'?\nA: I should expect to see the weather. The screenshot shows "
                 "the weather.\nStatus: success")
FAILURE_REPLY = SUCCESS_REPLY.replace("Status: success", "Status: failure")
NO_STATUS = "Q: What should I expect?\nA: I should expect to see something."
TASK = "What's the weather like in Paris?"


@pytest.fixture
def few_shot(tmp_path):
    rows = [("ex_a.png", pattern_image(54, 114, seed=10), "Open the settings",
             "Q: What should I expect to see on the screenshot if I've opened the settings?\n"
             "A: I should expect to see the settings. The screenshot shows the home screen.\n"
             "Status: failure"),
            ("ex_b.png", pattern_image(60, 120, seed=11), "Search for cats",
             "Q: What should I expect to see on the screenshot if I've searched for cats?\n"
             "A: I should expect to see results for cats. The screenshot shows them.\n"
             "Status: success")]
    with open(tmp_path / "labels.jsonl", "w") as f:
        for name, img, task, answer in rows:
            img.save(tmp_path / name)
            f.write(json.dumps({"image": name, "task": task, "answer": answer}) + "\n")
    return paper.FewShotSet.load(tmp_path), rows


def make_judge(case, sleeps=None, **kw):
    backend_kw = {"timeout_s": kw.pop("timeout_s")} if "timeout_s" in kw else {}
    sleeps = [] if sleeps is None else sleeps
    judge = paper.PaperJudge(case.make(**backend_kw), kw.pop("examples", None),
                             sleep=sleeps.append, seed=0, backoff_s=1.0, **kw)
    return judge, sleeps


def assert_backoff_grows(sleeps, n, backoff_s=1.0):
    assert len(sleeps) == n
    assert all(b > a for a, b in zip(sleeps, sleeps[1:])), sleeps
    for k, s in enumerate(sleeps):  # doubled each time, +-25% jitter
        assert 0.75 * backoff_s * 2**k <= s <= 1.25 * backoff_s * 2**k, sleeps


def test_paper_request_has_examples_and_shrunk_screen(case, few_shot):
    examples, rows = few_shot
    case.server.reply(SUCCESS_REPLY)
    judge, sleeps = make_judge(case, examples=examples)
    prev = pattern_image(1080, 2280, seed=5)
    cur = quadrant_image()
    r = judge.judge(TASK, prev, cur)

    assert r.verdict is Verdict.SUCCESS and r.reply == SUCCESS_REPLY
    assert r.calls == 1 and r.skipped is None and sleeps == []
    assert r.tokens == 18 and r.latency_s > 0
    assert case.server.count == 1
    parts = case.parts(case.server.requests[0])
    images = [v for k, v in parts if k == "image"]
    texts = [v for k, v in parts if k == "text"]
    # the few-shot images in order, then the current screenshot (never the previous one)
    assert len(images) == len(rows) + 1
    for (_, img, _, _), sent in zip(rows, images):
        assert same_pixels(sent, img)
    shot = images[-1]
    assert shot.size == (270, 570)
    for (fx, fy), colour in QUADRANT_COLOURS.items():
        assert shot.getpixel((int(fx * 270), int(fy * 570))) == colour
    # each example's task and labelled answer come with it; the task comes after the shot
    joined = "\n".join(texts)
    for _, _, task, answer in rows:
        assert task in joined and answer in joined
    last_image_at = max(i for i, (k, _) in enumerate(parts) if k == "image")
    assert any(k == "text" and TASK in v for k, v in parts[last_image_at + 1:])
    assert all(TASK not in v for k, v in parts[:last_image_at] if k == "text")
    assert "Status: success or failure" in joined


def test_paper_zero_shot_sends_one_image(case):
    case.server.reply(SUCCESS_REPLY)
    judge, _ = make_judge(case)
    assert judge.judge(TASK, None, quadrant_image()).verdict is Verdict.SUCCESS
    images = [v for k, v in case.parts(case.server.requests[0]) if k == "image"]
    assert [im.size for im in images] == [(270, 570)]


@pytest.mark.parametrize("reply,verdict", [
    (SUCCESS_REPLY, Verdict.SUCCESS),
    (FAILURE_REPLY, Verdict.FAILURE),
])
def test_paper_verdict_from_reply(case, reply, verdict):
    case.server.reply(reply)
    judge, sleeps = make_judge(case)
    r = judge.judge(TASK, None, quadrant_image())
    assert r.verdict is verdict and r.reply == reply
    assert r.calls == 1 and r.skipped is None and sleeps == []
    assert case.server.count == 1


@pytest.mark.parametrize("failures", [("429", "500"), ("timeout", "503")])
def test_paper_retries_then_succeeds(case, failures):
    for f in failures:
        if f == "timeout":
            case.server.sleep(1.5)
        else:
            case.server.error(int(f))
    case.server.reply(SUCCESS_REPLY)
    judge, sleeps = make_judge(case, timeout_s=0.4)
    r = judge.judge(TASK, None, quadrant_image())
    assert r.verdict is Verdict.SUCCESS and r.reply == SUCCESS_REPLY
    assert r.calls == 3 and r.skipped is None
    assert case.server.count == 3
    assert_backoff_grows(sleeps, 2)


def test_paper_five_failures_are_unjudged(case):
    for _ in range(5):
        case.server.error(500)
    judge, sleeps = make_judge(case)
    r = judge.judge(TASK, None, quadrant_image())
    assert r.verdict is Verdict.UNJUDGED  # never a silent failure
    assert r.verdict is not Verdict.FAILURE
    assert r.calls == 5 == judge.max_attempts
    assert r.skipped and "5" in r.skipped and "500" in r.skipped
    assert case.server.count == 5 and case.server.pending == 0
    assert_backoff_grows(sleeps, 4)
    assert judge.unjudged == 1 and judge.calls == 5


def test_paper_max_attempts_is_honoured(case):
    for _ in range(3):
        case.server.error(429)
    judge, sleeps = make_judge(case, max_attempts=3)
    r = judge.judge(TASK, None, quadrant_image())
    assert r.verdict is Verdict.UNJUDGED and r.calls == 3
    assert case.server.count == 3
    assert_backoff_grows(sleeps, 2)


def test_paper_non_retryable_error_stops_at_once(case):
    case.server.error(401)
    judge, sleeps = make_judge(case)
    r = judge.judge(TASK, None, quadrant_image())
    assert r.verdict is Verdict.UNJUDGED and r.calls == 1
    assert r.skipped and "401" in r.skipped
    assert SECRET not in r.skipped
    assert case.server.count == 1 and sleeps == []


def test_paper_malformed_reply_is_retried(case):
    case.server.reply(NO_STATUS).reply("Q: x\nA: y\nStatus: maybe").reply(FAILURE_REPLY)
    judge, sleeps = make_judge(case)
    r = judge.judge(TASK, None, quadrant_image())
    assert r.verdict is Verdict.FAILURE and r.reply == FAILURE_REPLY
    assert r.calls == 3 and case.server.count == 3
    assert r.tokens == 3 * 18  # every reply was billed
    assert_backoff_grows(sleeps, 2)


def test_paper_malformed_reply_throughout_is_unjudged(case):
    for i in range(5):
        case.server.reply(f"{NO_STATUS} ({i})")
    judge, sleeps = make_judge(case)
    r = judge.judge(TASK, None, quadrant_image())
    assert r.verdict is Verdict.UNJUDGED
    assert r.calls == 5 and case.server.count == 5
    assert r.reply == f"{NO_STATUS} (4)"
    assert r.skipped and "Status" in r.skipped
    assert_backoff_grows(sleeps, 4)


@pytest.mark.parametrize("kind", ["gemini", "openai"])
def test_paper_malformed_body_is_retried(kind, request, monkeypatch):
    server = request.getfixturevalue(f"{kind}_server")
    c = Case(kind, server, monkeypatch, SECRET)
    server.malformed(b"<html>502 Bad Gateway</html>")
    server.reply(SUCCESS_REPLY)
    judge, sleeps = make_judge(c)
    r = judge.judge(TASK, None, quadrant_image())
    assert r.verdict is Verdict.SUCCESS and r.calls == 2
    assert server.count == 2


@pytest.mark.slow
def test_paper_guards_save_calls(case):
    case.server.reply(SUCCESS_REPLY)
    judge, _ = make_judge(case)
    cur = quadrant_image()
    first = judge.judge(TASK, pattern_image(1080, 2280, seed=7), cur)
    assert first.verdict is Verdict.SUCCESS and case.server.count == 1
    # the same screen again: no call, the remembered verdict
    again = judge.judge(TASK, pattern_image(1080, 2280, seed=8), cur.copy())
    assert again.verdict is Verdict.SUCCESS and again.skipped and again.calls == 0
    # an unchanged screen: no call
    judge.reset()
    still = judge.judge("Open the clock", cur, cur.copy())
    assert still.skipped and still.calls == 0
    assert case.server.count == 1
    # an unjudged screen is not remembered: it is asked again
    other = pattern_image(1080, 2280, seed=9)
    for _ in range(5):
        case.server.error(503)
    assert judge.judge("Open the clock", None, other).verdict is Verdict.UNJUDGED
    case.server.reply(FAILURE_REPLY)
    r = judge.judge("Open the clock", None, other)
    assert r.verdict is Verdict.FAILURE and r.calls == 1
    assert case.server.count == 7
