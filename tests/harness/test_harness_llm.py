"""The LLM side of the harness (issue 30): the prompted agent and the LLM proposer, end to end
through the real client libraries against the local Gemini and OpenAI protocol servers
(tests/judge_servers.py): what each request carries, what a reply becomes, retries, errors
that never leak the key, the proposer's reply parsing and its replay cache, and one short
episode of a harness around a prompted agent on the simulated phone.
"""

from __future__ import annotations

import json
import sys
import traceback

import pytest
from judge_servers import (
    GeminiServer,
    OpenAIServer,
    Recorded,
    ServerCase,
)
from needs import free_port

from digirl_lite.actions import Action, ActionType, format_action, parse_action
from digirl_lite.envs.base import Observation
from digirl_lite.envs.uitree import tree_text
from digirl_lite.harness.evidence import (
    Evidence,
    EvidenceStep,
    Memory,
    ProposalError,
)
from digirl_lite.harness.harness import (
    H0_COMPONENTS,
    AgentInput,
    Harness,
    HarnessAgent,
)
from digirl_lite.harness.llm import (
    ACTION_FORMAT,
    AgentUnavailable,
    LLMProposer,
    PromptedAgent,
)
from digirl_lite.judge.backends import GeminiBackend, OpenAIBackend, make_backend

SECRET = "sk-test-SECRET-harness-42"
W, H = 1080, 2280
# the simulator's home screen: the Chrome icon spans (40,560)-(260,820) in pixels
CHROME_TAP = format_action(Action.tap(x=round(150 / W, 4), y=round(690 / H, 4)))
MALFORMED = "I think the next step is to tap on the Chrome icon."


pytestmark = pytest.mark.usefixtures("no_judge_keys")


class Case(ServerCase):
    """One protocol against its local server: backends for it, its requests read back."""

    def config(self, port: int | None = None, **kw) -> dict:
        model = "gemini-test" if self.kind == "gemini" else "qwen-vl"
        return {"backend": self.kind, "model": model, "base_url": self.url(port), **kw}

    def texts(self, rec: Recorded) -> str:
        return "\n".join(v for k, v in self.parts(rec) if k == "text")


@pytest.fixture(params=["gemini", "openai"])
def case(request, monkeypatch):
    server = GeminiServer() if request.param == "gemini" else OpenAIServer()
    with server:
        yield Case(request.param, server, monkeypatch, SECRET)


@pytest.fixture
def openai_case(monkeypatch):
    with OpenAIServer() as server:
        yield Case("openai", server, monkeypatch, SECRET)


@pytest.fixture(scope="module")
def home():
    """The simulated phone's home screen with its UI tree, and its env."""
    from digirl_lite.envs.sim.env import SimPhoneEnv

    env = SimPhoneEnv(tasks="general", ui_tree=True, seed=0)
    obs, _ = env.reset(task="Open Chrome")
    yield obs
    env.close()


def agent_input(obs: Observation, history=(), tree: bool = True, prompt: str | None = None
                ) -> AgentInput:
    return AgentInput(obs=obs, system_prompt=prompt or H0_COMPONENTS["system_prompt"],
                      history=tuple(history),
                      tree=tree_text(obs.ui_tree, 60) if tree else None)


# ---------------------------------------------------------------------------------------
# make_backend: one way to build a backend
# ---------------------------------------------------------------------------------------
def test_make_backend_builds_round_trips_and_names_bad_fields():
    g = make_backend({"backend": "gemini", "model": "gemini-test"})
    assert isinstance(g, GeminiBackend) and g.model == "gemini-test"
    o = make_backend({"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:1/v1",
                      "api_key_env": None, "max_tokens": 2048})
    assert isinstance(o, OpenAIBackend) and o.max_tokens == 2048 and o.api_key_env is None
    for b in (g, o):  # a saved config builds the same backend
        assert make_backend(b.config()).config() == b.config()
    with pytest.raises(ValueError, match="field 'backend' is 'claude'"):
        make_backend({"backend": "claude", "model": "x"})
    with pytest.raises(ValueError, match="field 'backend'"):
        make_backend({"model": "x"})
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['modle'\]"):
        make_backend({"backend": "gemini", "modle": "x"})
    with pytest.raises(ValueError, match="'model'"):
        make_backend({"backend": "openai"})
    # the judge's factory builds through it (gemini when the config names none)
    from digirl_lite.envs.judges import make_judge

    assert isinstance(make_judge({"judge": "paper"}).backend, GeminiBackend)
    with pytest.raises(ValueError, match="field 'backend'"):
        make_judge({"judge": "paper", "backend": {"backend": "claude"}})


# ---------------------------------------------------------------------------------------
# the prompted agent
# ---------------------------------------------------------------------------------------
def test_agent_request_carries_prompt_goal_history_tree_and_image(case, home):
    case.server.reply(CHROME_TAP)
    agent = PromptedAgent(case.config(), image_width=270)
    prompt = H0_COMPONENTS["system_prompt"] + "\n\nALWAYS-READ-THE-TREE marker paragraph."
    last = format_action(Action.key(ActionType.PRESS_HOME))
    out = agent.propose([agent_input(home, history=[last], prompt=prompt)])

    assert out == [CHROME_TAP] and parse_action(out[0]).is_valid
    assert case.server.count == 1 and agent.calls == 1
    parts = case.parts(case.server.requests[0])
    text = case.texts(case.server.requests[0])
    assert "ALWAYS-READ-THE-TREE marker paragraph." in text  # the harness's system prompt
    assert "Goal: Open Chrome" in text
    assert last in text  # the last actions
    assert '[icon:chrome] TextView "Chrome" (40,560,260,820) clickable' in text  # the tree
    assert "1080 x 2280" in text  # pixels of the tree's bounds vs normalised points
    assert ACTION_FORMAT in text and 'Action Decision: "action_type"' in text
    assert "did not parse" not in text
    images = [v for k, v in parts if k == "image"]
    assert [im.size for im in images] == [(270, 570)]  # shrunk, aspect kept
    # the format comes last, after the screenshot
    assert parts[-1] == ("text", ACTION_FORMAT)


def test_agent_without_tree_or_history(openai_case, home):
    agent = PromptedAgent(openai_case.config())
    agent.propose([agent_input(home, tree=False)])
    text = openai_case.texts(openai_case.server.requests[0])
    assert "icon:chrome" not in text and "UI elements on the screen (" not in text
    assert "Previous actions: none" in text
    images = [v for k, v in openai_case.parts(openai_case.server.requests[0]) if k == "image"]
    assert [im.size for im in images] == [(540, 1140)]  # the default width


def test_agent_batch_is_one_request_per_input_in_order(openai_case, home):
    replies = [CHROME_TAP, format_action(Action.key(ActionType.PRESS_BACK)), MALFORMED]
    for r in replies:
        openai_case.server.reply(r)
    agent = PromptedAgent(openai_case.config())
    assert agent.propose([agent_input(home)] * 3) == replies
    assert openai_case.server.count == 3


def test_agent_thread_pool_batch(openai_case, home):
    openai_case.server.default_text = CHROME_TAP
    agent = PromptedAgent(openai_case.config(), workers=3)
    assert agent.propose([agent_input(home)] * 5) == [CHROME_TAP] * 5
    assert openai_case.server.count == 5


def test_malformed_reply_goes_back_as_text(case, home):
    case.server.reply(MALFORMED)
    agent = PromptedAgent(case.config())
    assert agent.propose([agent_input(home)]) == [MALFORMED]  # no raise
    # under H0 (no repair, no retry) the harness passes it on: an invalid step, the agent's
    case.server.reply(MALFORMED)
    harness = HarnessAgent(H0_COMPONENTS, agent)
    [a] = harness.act_batch([0], [home])
    assert str(a) == MALFORMED and a.decided_by == "agent"
    assert not parse_action(a).is_valid
    assert case.server.count == 2  # no retry under H0


def test_retry_restates_the_format(case, home):
    case.server.reply(MALFORMED).reply(CHROME_TAP)
    comps = Harness().extend([_edit("xi", '{"retry": true}')]).components
    harness = HarnessAgent(comps, PromptedAgent(case.config()))
    [a] = harness.act_batch([0], [home])
    assert parse_action(a) == parse_action(CHROME_TAP)
    assert a.decided_by == "xi:retry"
    assert case.server.count == 2
    first, again = (case.texts(r) for r in case.server.requests)
    assert "did not parse" not in first
    assert "did not parse" in again and MALFORMED[:40] in again  # says what it wrote
    assert ACTION_FORMAT in again  # the format, exactly
    assert "Goal: Open Chrome" in again  # the same step's input


def test_retryable_error_is_retried_with_backoff(case, home):
    case.server.error(503).reply(CHROME_TAP)
    sleeps: list[float] = []
    agent = PromptedAgent(case.config(), backoff_s=1.0, sleep=sleeps.append, seed=0)
    assert agent.propose([agent_input(home)]) == [CHROME_TAP]
    assert case.server.count == 2 and agent.calls == 2
    assert len(sleeps) == 1 and 0.75 <= sleeps[0] <= 1.25


def test_retries_run_out(case, home):
    for _ in range(3):
        case.server.error(429)
    sleeps: list[float] = []
    agent = PromptedAgent(case.config(), retries=2, backoff_s=1.0, sleep=sleeps.append)
    with pytest.raises(AgentUnavailable) as ei:
        agent.propose([agent_input(home)])
    assert "429" in str(ei.value) and "3 attempt(s)" in str(ei.value)
    assert case.url() in str(ei.value)
    assert case.server.count == 3 and len(sleeps) == 2 and sleeps[1] > sleeps[0]
    assert isinstance(ei.value, RuntimeError)


def test_unauthorised_raises_without_the_key(case, home):
    # the server echoes the key back: neither the backend nor the agent may pass it on
    case.server.error(401, f"API key not valid: {SECRET}")
    sleeps: list[float] = []
    agent = PromptedAgent(case.config(), sleep=sleeps.append)
    with pytest.raises(AgentUnavailable) as ei:
        agent.propose([agent_input(home)])
    e = ei.value
    assert "401" in str(e)
    assert case.url() in str(e) and case.kind in str(e)  # names the backend
    assert SECRET not in str(e) and SECRET not in repr(e)
    assert SECRET not in "".join(traceback.format_exception(e))
    assert SECRET not in repr(agent) and SECRET not in json.dumps(agent.config())
    assert case.server.count == 1 and sleeps == []  # not retryable: one request


def test_missing_key_is_agent_unavailable(case, home, monkeypatch):
    monkeypatch.delenv(case.key_env)
    with pytest.raises(AgentUnavailable, match=case.key_env):
        PromptedAgent(case.config()).propose([agent_input(home)])
    assert case.server.count == 0


def test_harness_around_prompted_agent_on_the_phone(case):
    """One short episode: the model taps the Chrome icon, the phone opens Chrome."""
    from digirl_lite.envs.sim.env import SimPhoneEnv

    case.server.reply(CHROME_TAP)
    case.server.default_text = format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))
    harness = HarnessAgent(H0_COMPONENTS, PromptedAgent(case.config()))
    with SimPhoneEnv(tasks="general", ui_tree=True, seed=0) as env:
        obs, _ = env.reset(task="Open Chrome")
        assert any(n.id == "icon:chrome" for n in obs.ui_tree)
        seen, decided, done, reward = [obs.screen_id], [], False, 0.0
        for _ in range(env.horizon):
            [a] = harness.act_batch([0], [obs])
            decided.append(a.decided_by)
            obs, reward, done, truncated, _ = env.step(a)
            seen.append(obs.screen_id)
            if done or truncated:
                break
    assert seen[1] != seen[0]  # the tap changed the screen
    assert not any(n.id == "icon:chrome" for n in obs.ui_tree)  # no longer the home screen
    assert decided and set(decided) == {"agent"}
    assert harness.decisions["agent"] == len(decided)
    assert done and reward == 1.0
    first = case.texts(case.server.requests[0])
    assert "[icon:chrome]" in first  # psi's default gives the tree
    assert case.server.count == len(decided)


# ---------------------------------------------------------------------------------------
# the LLM proposer
# ---------------------------------------------------------------------------------------
def _edit(kind: str, content: str):
    from digirl_lite.harness.harness import Edit

    return Edit(kind, content, {"proposer": "test"})


RULE = {"id": "dismiss-consent", "when": {"element": {"id": "consent:accept"}},
        "do": {"tap": {"id": "consent:accept"}}}
GOOD = {"edits": [
    {"kind": "skill", "content": json.dumps(RULE), "rationale": "the banner blocked 3 runs"},
    {"kind": "xi", "content": '{"repair": true}', "rationale": "unparseable outputs"},
    {"kind": "prompt", "content": "Close pop-ups before anything else.", "rationale": "r"},
]}


def evidence() -> list[Evidence]:
    tree = '[consent:accept] Button "Accept all" (100,1800,980,1900) clickable\n' + "x" * 5000
    fail = Evidence("failure", "Go to costco.com", (
        EvidenceStep(0, tree, "Action Decision: junk", valid=False, screen_changed=False),),
        at=0, theme="overlay", summary="stuck behind the consent banner")
    teach = Evidence("teacher", "Search for a usb c cable", (
        EvidenceStep(0, "[address_bar] EditText", CHROME_TAP),), theme="wrong_page")
    return [fail, teach]


def memory() -> Memory:
    return Memory().aggregate(evidence(), worked=[{"content": "WORKED-EDIT-CONTENT", "g": 1}],
                              regressed=[{"content": "REGRESSED-EDIT-CONTENT", "R": 0.7}])


def test_proposer_valid_reply_gives_edits_that_apply(openai_case):
    openai_case.server.reply(json.dumps(GOOD))
    p = LLMProposer(openai_case.config())
    assert p.name == "llm"
    edits = p.propose(dict(H0_COMPONENTS), evidence(), memory())
    assert [e.kind for e in edits] == ["skill", "xi", "prompt"]
    child = Harness().extend(edits)
    comps = child.components
    assert "dismiss-consent" in comps["skills"] and json.loads(comps["xi"])["repair"] is True
    assert comps["system_prompt"].endswith("Close pop-ups before anything else.")
    for e, want in zip(edits, GOOD["edits"]):
        assert e.provenance == {"proposer": "llm", "model": "qwen-vl",
                                "evidence": ["failure", "teacher"],
                                "rationale": want["rationale"]}
    # what the model was shown
    [(kind, prompt)] = openai_case.parts(openai_case.server.requests[0])
    assert kind == "text"
    assert H0_COMPONENTS["system_prompt"] in prompt and '"snap_px": 160' in prompt
    assert "``when`` holds conditions" in prompt  # the rule language, from rules.py
    assert "Go to costco.com" in prompt and "stuck behind the consent banner" in prompt
    assert "(trimmed)" in prompt and "x" * 2000 not in prompt  # the evidence is bounded
    assert "overlay: 1" in prompt  # the memory's themes
    assert "WORKED-EDIT-CONTENT" in prompt and "REGRESSED-EDIT-CONTENT" in prompt
    assert '{"edits": [{"kind": "skill" | "prompt" | "xi" | "psi"' in prompt


@pytest.mark.parametrize("wrap", [
    "Here are my edits:\n```json\n{body}\n```\nHope this helps.",
    "```\n{body}\n```",
    "Sure. {body} -- these should fix the banner.",
])
def test_proposer_reply_in_a_fence_or_prose(openai_case, wrap):
    openai_case.server.reply(wrap.format(body=json.dumps(GOOD, indent=2)))
    edits = LLMProposer(openai_case.config()).propose(dict(H0_COMPONENTS), evidence(),
                                                       Memory())
    assert [e.kind for e in edits] == ["skill", "xi", "prompt"]


def test_proposer_over_gemini(case):
    case.server.reply("```json\n" + json.dumps(GOOD) + "\n```")
    edits = LLMProposer(case.config(), max_edits=2).propose(dict(H0_COMPONENTS), evidence(),
                                                            Memory())
    assert [e.kind for e in edits] == ["skill", "xi"]  # max_edits keeps the first ones
    assert edits[0].provenance["model"] == case.config()["model"]


def test_proposer_takes_json_values_as_content(openai_case):
    """Settings and rules given as JSON values (not strings) are the text they stand for."""
    reply = {"edits": [{"kind": "xi", "content": {"snap": True, "snap_px": 200}},
                       {"kind": "skill", "content": [RULE]}]}
    openai_case.server.reply(json.dumps(reply))
    edits = LLMProposer(openai_case.config()).propose(dict(H0_COMPONENTS), evidence(),
                                                       Memory())
    comps = Harness().extend(edits).components
    assert json.loads(comps["xi"])["snap_px"] == 200
    assert json.loads(comps["skills"].splitlines()[0]) == RULE
    assert edits[0].provenance["rationale"] == ""


BAD_RULE = json.dumps({"id": "fly", "when": {}, "do": "fly"})


@pytest.mark.parametrize("reply,reason", [
    ("I am sorry, I cannot propose edits for this harness.", "not JSON"),
    (json.dumps({"edits": []}), "no edits"),
    (json.dumps({"thoughts": "none"}), "no edits"),
    (json.dumps({"edits": [{"kind": "skill", "content": json.dumps(RULE) + "\n" + BAD_RULE}]}),
     r"edit 1 \(skill\), line 2: rule 'fly': do 'fly' is not one of"),
    (json.dumps({"edits": [{"kind": "skill", "content": "{not json"}]}), "line 1: not JSON"),
    (json.dumps({"edits": [{"kind": "code", "content": "def f(): pass"}]}),
     "unknown kind 'code'"),
    (json.dumps({"edits": [{"kind": "xi", "content": '{"repair": "yes"}'}]}),
     "repair must be bool"),
    (json.dumps({"edits": [{"kind": "prompt", "content": "  "}]}), "non-empty text"),
])
def test_proposer_bad_reply_is_a_proposal_error(openai_case, reply, reason):
    openai_case.server.reply(reply)
    with pytest.raises(ProposalError, match=reason) as ei:
        LLMProposer(openai_case.config()).propose(dict(H0_COMPONENTS), evidence(), Memory())
    assert f"reply starts {reply.strip()[:40]!r}"[:-1] in str(ei.value)  # quotes the reply


def test_proposer_second_edit_that_clashes_with_the_first(openai_case):
    reply = {"edits": [{"kind": "skill", "content": json.dumps(RULE)},
                       {"kind": "skill", "content": json.dumps(RULE)}]}
    openai_case.server.reply(json.dumps(reply))
    with pytest.raises(ProposalError, match=r"edit 2.*already in the parent"):
        LLMProposer(openai_case.config()).propose(dict(H0_COMPONENTS), evidence(), Memory())


def test_proposer_drops_edits_already_tried(openai_case):
    m = Memory(regressed=[{"content": '{"repair": true}', "R": 1.0}])
    openai_case.server.reply(json.dumps(GOOD))
    edits = LLMProposer(openai_case.config()).propose(dict(H0_COMPONENTS), evidence(), m)
    assert [e.kind for e in edits] == ["skill", "prompt"]
    only = {"edits": [GOOD["edits"][1]]}
    openai_case.server.reply(json.dumps(only))
    with pytest.raises(ProposalError, match="tried before"):
        LLMProposer(openai_case.config()).propose(dict(H0_COMPONENTS), evidence(), m)


def test_proposer_backend_failure_is_a_proposal_error(openai_case):
    openai_case.server.error(401, f"bad key {SECRET}")
    with pytest.raises(ProposalError) as ei:
        LLMProposer(openai_case.config(), sleep=lambda s: None).propose(
            dict(H0_COMPONENTS), evidence(), Memory())
    assert "401" in str(ei.value) and openai_case.url() in str(ei.value)
    assert SECRET not in str(ei.value)
    for _ in range(2):
        openai_case.server.error(503)
    sleeps: list[float] = []
    p = LLMProposer(openai_case.config(), retries=1, sleep=sleeps.append)
    with pytest.raises(ProposalError, match=r"2 attempt\(s\): .*503"):
        p.propose(dict(H0_COMPONENTS), evidence(), Memory())
    assert openai_case.server.count == 3 and len(sleeps) == 1


def test_proposer_cache_replays_without_the_api(monkeypatch, tmp_path):
    cache = tmp_path / "proposals.jsonl"
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    comps, ev, mem = dict(H0_COMPONENTS), evidence(), memory()
    with OpenAIServer() as server:
        server.reply(json.dumps(GOOD))
        cfg = {"backend": "openai", "model": "qwen-vl", "base_url": server.url + "/v1"}
        p = LLMProposer(cfg, cache_path=cache)
        first = p.propose(comps, ev, mem)
        assert server.count == 1 and p.calls == 1 and p.cache_hits == 0
    assert len(cache.read_text().splitlines()) == 1
    assert SECRET not in cache.read_text()
    # a resumed run: the server is gone, the same prompt is answered from the cache
    with open(cache, "a") as f:
        f.write('{"key": "torn')  # kill -9 mid-write: skipped
    dead = {**cfg, "base_url": f"http://127.0.0.1:{free_port()}/v1"}
    p2 = LLMProposer(dead, cache_path=cache, retries=0)
    again = p2.propose(comps, ev, mem)
    assert [e.as_dict() for e in again] == [e.as_dict() for e in first]
    assert p2.calls == 0 and p2.cache_hits == 1
    # the second request of the same prompt is a new one (not replayed): the API is asked
    with pytest.raises(ProposalError, match="failed after 1 attempt"):
        p2.propose(comps, ev, mem)
    # a different prompt is not answered from the cache
    with pytest.raises(ProposalError):
        LLMProposer(dead, cache_path=cache, retries=0).propose(comps, ev, Memory())
    # a live server with another default reply: still the cached proposal
    with OpenAIServer() as server:
        server.default_text = json.dumps({"edits": [{"kind": "prompt", "content": "other"}]})
        p3 = LLMProposer({**cfg, "base_url": server.url + "/v1"}, cache_path=cache)
        assert [e.as_dict() for e in p3.propose(comps, ev, mem)] == \
            [e.as_dict() for e in first]
        assert server.count == 0


def test_import_is_light():
    import subprocess

    code = ("import sys, digirl_lite.harness.llm\n"
            "print([m for m in ('torch', 'openai', 'google.genai', 'httpx') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
