"""The LLM proposer inside DarwinX (issue 48, item 3): whole evolutions whose proposals come
from a local OpenAI-protocol server (tests/judge_servers.py) answering from recorded replies
(data/fixtures/llm_proposals.json), through the real openai client. The proposals reach the
harness and are gated like any other; a reply that is not a valid edit is counted and
skipped; prompt and psi edits reach a prompted agent and are refused, with a message naming
the component and the agent, for the policy agent that cannot read them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from judge_servers import Recorded, RoutedOpenAIServer

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.harness.darwinx import (
    STALL_GENERATIONS,
    DarwinX,
    select_parent,
)
from digirl_lite.harness.harness import (
    AGENT_COMPONENTS,
    H0_COMPONENTS,
    Edit,
    EditError,
    Harness,
    HarnessAgent,
    PolicyAgent,
    check_readable,
)
from digirl_lite.harness.llm import LLMProposer, PromptedAgent

pytest.importorskip("gepa")

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((ROOT / "data" / "fixtures" / "llm_proposals.json").read_text())
PROPOSER, AGENT = "proposer-recorded", "agent-scripted"
W, H = 1080, 2280
# the simulator's home screen: the Chrome icon spans (40,560)-(260,820) in pixels
CHROME_TAP = format_action(Action.tap(x=round(150 / W, 4), y=round(690 / H, 4)))
COMPLETE = format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))


def texts(rec: Recorded) -> str:
    """The text parts of a chat completion request."""
    content = rec.json["messages"][0]["content"]
    return "\n".join(c["text"] for c in content if c["type"] == "text")


def recorded(scenario: str):
    """``(request) -> reply``: the scenario's n-th recorded reply for the n-th request, the
    last one again once they run out."""
    replies = [r["text"] for r in FIXTURE[scenario]["replies"]]
    asked = []

    def answer(rec: Recorded) -> str:
        assert "## Evidence" in texts(rec)  # a proposer prompt, not something else
        asked.append(rec)
        return replies[min(len(asked), len(replies)) - 1]
    return answer


def edit_of(scenario: str, n: int) -> dict:
    """The edit of the scenario's n-th reply (0-based) as it was recorded."""
    text = FIXTURE[scenario]["replies"][n]["text"]
    body = text[text.index("{"):text.rindex("}") + 1]
    [e] = json.loads(body)["edits"]
    return e


# ---------------------------------------------------------------------------------------
# refusing edits the agent cannot read
# ---------------------------------------------------------------------------------------
def test_prompt_and_psi_edits_are_refused_for_an_agent_that_cannot_read_them():
    assert PolicyAgent.reads == frozenset() and PromptedAgent.reads == set(AGENT_COMPONENTS)
    name = "policy agent (sft-webshop)"
    with pytest.raises(EditError) as ei:
        check_readable([Edit("skill", "{}"), Edit("prompt", "Be careful.")], PolicyAgent.reads,
                       name)
    msg = str(ei.value)
    assert "edit 2" in msg and "'prompt' edit" in msg and "'system_prompt'" in msg
    assert name in msg and "['skill', 'xi']" in msg
    with pytest.raises(EditError, match=r"'psi' edit changes the component 'psi', which the "
                                        r"policy agent \(sft-webshop\) cannot read"):
        check_readable([Edit("psi", '{"history": 3}')], PolicyAgent.reads, name)
    check_readable([Edit("skill", "{}"), Edit("xi", "{}")], PolicyAgent.reads, name)
    check_readable([Edit("prompt", "p"), Edit("psi", "{}")], PromptedAgent.reads, "prompted")
    # a harness says what its agent reads; an agent that does not say reads both
    assert HarnessAgent(H0_COMPONENTS, PromptedAgent({"backend": "openai", "model": "m"})) \
        .reads == set(AGENT_COMPONENTS)
    assert HarnessAgent(H0_COMPONENTS, object()).reads == set(AGENT_COMPONENTS)


def test_the_proposer_is_offered_only_the_edits_its_agent_can_read():
    from digirl_lite.harness.evidence import Memory
    from digirl_lite.harness.llm import proposer_prompt

    full = proposer_prompt(dict(H0_COMPONENTS), [], Memory())
    assert '"kind": "skill" | "prompt" | "xi" | "psi"' in full and "### system_prompt" in full
    cut = proposer_prompt(dict(H0_COMPONENTS), [], Memory(), kinds=("skill", "xi"))
    assert '"kind": "skill" | "xi",' in cut
    assert "### system_prompt" not in cut and "### psi" not in cut and "### skills" in cut
    assert "cannot read what ['prompt', 'psi'] edits change" in cut
    with pytest.raises(ValueError, match="kinds must be some of"):
        LLMProposer({"backend": "openai", "model": "m"}, kinds=("skill", "code"))


def test_the_recipe_offers_the_policy_agent_skills_and_xi_and_room_to_reply(tmp_path):
    from digirl_lite.harness.evolve import EvolveConfig, _agent_view, _proposer

    backend = {"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1",
               "api_key_env": None}
    cfg = EvolveConfig(proposer="llm", proposer_backend=backend)
    reads, name = _agent_view(cfg, "/x/sft-webshop")
    assert reads == frozenset() and name.startswith("policy agent (sft-webshop")
    p = _proposer(cfg, tmp_path, reads)
    assert p.kinds == ("skill", "xi")
    # the backend's default 512 tokens would cut a reply of three edits short
    assert p.backend.max_tokens == 2048
    assert _proposer(EvolveConfig(proposer="llm", proposer_backend={**backend, "max_tokens": 99}),
                     tmp_path, reads).backend.max_tokens == 99
    pcfg = EvolveConfig(agent="prompted", agent_backend={**backend, "model": "vlm"},
                        proposer="llm", proposer_backend=backend)
    reads, name = _agent_view(pcfg, None)
    assert reads == set(AGENT_COMPONENTS) and name == "prompted agent (vlm)"
    assert _proposer(pcfg, tmp_path, reads).kinds == ("skill", "prompt", "xi", "psi")


# ---------------------------------------------------------------------------------------
# a prompted agent: prompt and psi edits reach it, and the gate judges what they do
# ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_prompt_and_psi_edits_from_the_llm_reach_a_prompted_agent_in_the_loop(tmp_path):
    """The agent (the server's ``AGENT`` route) opens Chrome only when its system prompt
    says how and it sees the icon in the tree: the LLM's prompt edit lifts both tasks from
    0 to 1 (accepted), its psi edit that hides the tree takes them back (rejected)."""
    from digirl_lite.envs.sim.env import SimEnvFactory
    from digirl_lite.harness.runner import HarnessRunner
    from digirl_lite.rollout.fleet import SyncFleet

    told = edit_of("prompted", 1)["content"]

    def agent(rec: Recorded) -> str:
        t = texts(rec)
        return CHROME_TAP if told in t and "[icon:chrome]" in t else COMPLETE

    calm = {"popup": 0.0, "consent": 0.0, "voice": 0.0, "reorder": 0.0, "blank": 0.0}
    fleet = SyncFleet(SimEnvFactory(tasks="general", ui_tree=True, surprises=calm), 2,
                      backend="local")  # a phone without pop-ups: the rates are the agent's
    with RoutedOpenAIServer({PROPOSER: recorded("prompted"), AGENT: agent}) as server:
        url = server.url + "/v1"
        prompted = PromptedAgent({"backend": "openai", "model": AGENT, "base_url": url,
                                  "api_key_env": None}, retries=0, image_width=90)
        runner = HarnessRunner(lambda c, s: HarnessAgent(c, prompted), fleet,
                               tmp_path / "episodes.jsonl", seed_torch=False)
        proposer = LLMProposer({"backend": "openai", "model": PROPOSER, "base_url": url,
                                "api_key_env": None}, retries=0)
        loop = DarwinX(runner, proposer, ["Open Chrome", "Launch Chrome"], tmp_path,
                       budget=200, k_screen=2, k_confirm=2, probe_k=1, beta=0.0,
                       max_generations=3, agent_reads=prompted.reads,
                       agent_name="prompted agent")
        archive = loop.run()
        agent_texts = [texts(r) for r in server.by_model(AGENT)]
        asked = server.by_model(PROPOSER)
    fleet.close()
    bad, good, hide = archive.nodes[1:]
    assert len(asked) == 3 and loop.invalid_proposals == 1
    assert not bad.accepted and bad.reason.startswith("invalid proposal") \
        and "do 'launch' is not one of" in bad.reason and not bad.edits
    # the prompt edit reached the agent and made it act: measured, gated, accepted
    assert [e["kind"] for e in good.edits] == ["prompt"]
    assert good.edits[0]["content"] == told and good.edits[0]["provenance"]["proposer"] == "llm"
    assert good.screen == {"Open Chrome": 1.0, "Launch Chrome": 1.0}
    assert good.accepted and good.g == pytest.approx(2.0) and good.kind == "improver"
    assert good.reason == "gate and probe passed" and good.confirm
    assert sum(told in t for t in agent_texts) >= 4
    # psi without the tree reached it too (its requests have no UI elements): rejected
    assert hide.parent == good.id and [e["kind"] for e in hide.edits] == ["psi"]
    assert json.loads(Harness.from_dict(hide.harness).components["psi"])["tree"] is False
    tree = "UI elements on the screen ("  # psi's tree, in agent_prompt_parts
    assert not any("[icon:chrome]" in t for t in agent_texts if tree not in t)
    assert any(told in t and tree not in t for t in agent_texts)
    assert hide.screen == {"Open Chrome": 0.0, "Launch Chrome": 0.0}
    assert not hide.accepted and hide.R == pytest.approx(2.0) and hide.reason.startswith("gate")
    assert select_parent(archive, 0.0, random.Random(0)).id == good.id
    # the second proposal's prompt carried the memory of the first: nothing had worked yet;
    # the third one's, the accepted prompt edit
    assert told not in texts(asked[1]) and told in texts(asked[2])
    saved = json.loads((tmp_path / "archive.json").read_text())
    assert saved["invalid_proposals"] == 1


# ---------------------------------------------------------------------------------------
# the recipe with the policy agent and proposer="llm"
# ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_whole_evolution_with_the_llm_proposer_and_the_policy_agent(tmp_path):
    from digirl_lite.harness.evolve import EvolveConfig, run_evolution

    with RoutedOpenAIServer({PROPOSER: recorded("policy")}) as server:
        cfg = EvolveConfig(proposer="llm", teacher="none", baselines=False,
                           proposer_backend={"backend": "openai", "model": PROPOSER,
                                             "base_url": server.url + "/v1",
                                             "api_key_env": None},
                           budget=200, evo_tasks=2, eval_tasks=2, k_screen=1, k_confirm=1,
                           probe_k=1, n_envs=3)
        lines: list[str] = []
        s = run_evolution(cfg, tmp_path, log=lambda *a: lines.append(" ".join(map(str, a))))
        asked = server.by_model(PROPOSER)
    archive = json.loads((tmp_path / "darwinx" / "archive.json").read_text())
    nodes = archive["nodes"][1:]
    replies = FIXTURE["policy"]["replies"]
    # one generation per proposal; then the last reply again, which the memory K_g refuses
    # as tried before, until STALL_GENERATIONS in a row measured nothing new and the loop
    # stops (a confirmation of the last child may still count in the first of them)
    assert len(asked) == len(nodes) and len(replies) + STALL_GENERATIONS <= len(nodes) \
        <= len(replies) + STALL_GENERATIONS + 1
    assert archive["stopped"].startswith("stalled")
    for rec in asked:
        assert rec.json["max_tokens"] == 2048
        assert '"kind": "skill" | "xi",' in texts(rec)  # the policy is offered these only
    reasons = [n["reason"] for n in nodes]
    assert "not JSON" in reasons[0]
    for i, comp in ((1, "system_prompt"), (3, "psi")):
        assert reasons[i].startswith("invalid proposal: proposal, edit 1:")
        assert f"changes the component {comp!r}, which the policy agent (sft-webshop" \
            in reasons[i] and "cannot read; refused" in reasons[i]
    assert all("tried before" in r for r in reasons[len(replies):])
    invalid = [n for n in nodes if n["reason"].startswith("invalid proposal")]
    assert s["evolution"]["invalid_proposals"] == archive["invalid_proposals"] == len(invalid)
    assert len(invalid) == len(nodes) - 2
    assert all(not n["accepted"] and not n["edits"] for n in invalid)
    # the skill and xi edits reached the harness and were gated on what they measured
    tasks = s["evolution_tasks"]
    for i in (2, 4):
        n = nodes[i]
        want = edit_of("policy", i)
        [e] = n["edits"]
        assert e["kind"] == want["kind"] and e["provenance"]["proposer"] == "llm"
        assert e["provenance"]["model"] == PROPOSER
        assert e["provenance"]["rationale"] == want["rationale"]
        comps = Harness.from_dict(n["harness"]).components
        if e["kind"] == "skill":
            assert "llm-unstick-back" in comps["skills"]
        else:
            assert json.loads(comps["xi"])["repair"] is True
        assert set(n["screen"]) == set(tasks)
        parent = next(p for p in archive["nodes"] if p["id"] == n["parent"])
        assert n["g"] == pytest.approx(sum(n["screen"][t] - parent["screen"][t]
                                           for t in tasks))
        assert n["reason"] in ("gate and probe passed", "the child equals a variant already "
                               "in the archive") or n["reason"].startswith(("gate: g =",
                                                                            "probe: lost"))
        assert n["accepted"] == (n["reason"] == "gate and probe passed")
    assert s["stages"]["evolved"]["judged_episodes"] == 2
    assert "invalid proposals skipped" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "proposer.jsonl").is_file()
