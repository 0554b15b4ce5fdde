"""TRL on the simulated phone must learn (issue 51): the SFT data are tool calls TRL's parser
reads back, in the chat the GRPO recipe builds; a model that cannot write tool calls is
refused before training; an episode an infrastructure fault ends gets no reward (dropped and
counted); and the recipe's ``--tiny --warmup`` runs both phases with held-out evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from needs import optional_import

TASK = "Go to ebay.com, search for 'logitech g910'"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Qwen3 with Qwen3's chat template (tokenizer trained on a few lines)."""
    optional_import("trl", 'pip install -e ".[trl]"')
    from digirl_lite.envs.sim.demos import sim_corpus
    from digirl_lite.policy.tiny_vlm import make_tiny_chat_lm

    return make_tiny_chat_lm(tmp_path_factory.mktemp("tiny"), seed=0,
                             corpus=sim_corpus(seed=0, n_demos=2))



@pytest.mark.slow
def test_a_model_that_cannot_write_tool_calls_is_refused_before_training(tiny_dir, tmp_path):
    """No chat template, or one that renders neither the tools nor the calls: a clear error
    (from the recipe: before any server starts or any step trains)."""
    import shutil

    from transformers import AutoTokenizer

    from digirl_lite.envs.sim.trl_warmup import ToolTemplateError, check_tool_template

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert check_tool_template(tok) is not None  # Qwen3's template: accepted
    tok.chat_template = None
    with pytest.raises(ToolTemplateError, match="no chat template"):
        check_tool_template(tok)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ToolTemplateError, match="ignores the tools"):
        check_tool_template(tok)
    bare = tmp_path / "no_template"
    shutil.copytree(tiny_dir, bare)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    recipe = _recipe()
    with pytest.raises(SystemExit, match="no chat template"):
        recipe.main(["--model", str(bare), "--warmup", "--out", str(tmp_path / "run")])
    assert not (tmp_path / "run" / "sft").exists()


@pytest.mark.slow
def test_the_sft_data_are_tool_calls_the_recipe_parses_in_the_recipes_chat(tiny_dir, server):
    """Each assistant turn of the expert's chats, rendered by the chat template and parsed
    with TRL's parser (as GRPOTrainer parses a reply), gives back its tool call, which maps
    to a valid action on the screen before it; the first user turn is what the served phone's
    tools give for the same task and seed, after ``Task: ...`` (TRL appends ``reset``'s
    return to the prompt's last turn)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import parse_response

    from digirl_lite.actions import parse_action
    from digirl_lite.envs.sim.trl_tools import phone_tools, tool_action
    from digirl_lite.envs.sim.trl_warmup import check_tool_template, expert_conversations

    data, counts = expert_conversations(n=3, seed=0, tasks=[TASK])
    assert counts["kept"] >= 1 and len(data) == counts["kept"]
    tok = check_tool_template(AutoTokenizer.from_pretrained(tiny_dir))
    msgs, tools = data[0]["messages"], json.loads(data[0]["tools"])
    assert [t["function"]["name"] for t in tools] == ["press_back", "press_enter", "press_home",
                                                       "tap", "task_complete", "type_text"]
    served = phone_tools(server.url, ui_tree_options={"max_nodes": 40})()
    assert msgs[1]["content"] == f"Task: {TASK}" + served.reset(task=TASK, seed=5_000)
    calls = 0
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = tok.apply_chat_template(msgs[:k], tools=tools, tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
        full = tok.apply_chat_template(msgs[:k + 1], tools=tools, tokenize=False)
        assert full.startswith(prompt)
        ids = tok(full[len(prompt):], add_special_tokens=False)["input_ids"]
        parsed = parse_response(tok, ids, prefix=tok(prompt, add_special_tokens=False)
                                ["input_ids"], tools=tools)
        (call,) = parsed["tool_calls"]
        want = m["tool_calls"][0]["function"]
        assert call["function"]["name"] == want["name"]
        assert call["function"]["arguments"] == json.loads(want["arguments"])
        screen = msgs[k - 1]["content"]
        text, note = tool_action(want["name"], json.loads(want["arguments"]), screen)
        assert parse_action(text).is_valid and not note
        calls += 1
    assert calls == (len(msgs) - 2) // 2 and msgs[-1]["content"].endswith("the task is done.")


@pytest.mark.slow
def test_a_tiny_tokenizer_trained_on_the_chats_text_writes_them_shorter(tmp_path):
    """``chat_text``: the system prompt, the tool schemas, every screen line and every call
    of the chats; a tiny model's tokenizer trained on it too (the recipe's ``--tiny
    --warmup``) encodes an episode in fewer tokens, and still round-trips its tool calls."""
    from transformers import AutoTokenizer

    from digirl_lite.envs.sim.demos import sim_corpus
    from digirl_lite.envs.sim.trl_tools import SYSTEM_PROMPT
    from digirl_lite.envs.sim.trl_warmup import (
        chat_text,
        check_tool_template,
        expert_conversations,
    )
    from digirl_lite.policy.tiny_vlm import make_tiny_chat_lm

    data, _ = expert_conversations(n=2, seed=0, tasks=[TASK])
    text = chat_text(data)
    assert SYSTEM_PROMPT in text and any("task_complete" in t for t in text)
    assert any(t.startswith("[icon:chrome]") for t in text)
    assert '{"name": "tap", "arguments": {"element": "icon:chrome"}}' in text
    corpus = sim_corpus(seed=0, n_demos=2)
    n = {}
    for name, lines in (("plain", corpus), ("chats", corpus + text)):
        tok = check_tool_template(AutoTokenizer.from_pretrained(make_tiny_chat_lm(
            tmp_path / name, corpus=lines, vocab_size=512, hidden_size=16,
            intermediate_size=32, num_hidden_layers=1)))
        n[name] = len(tok.apply_chat_template(data[0]["messages"], tools=json.loads(
            data[0]["tools"]), tokenize=True, return_dict=True)["input_ids"])
    assert n["chats"] < 0.9 * n["plain"]


@pytest.mark.slow
def test_the_evaluation_agent_renders_the_chat_as_sft_trained_on_it(tiny_dir):
    """The held-out evaluation's prompt at every step of an expert chat is a prefix of what
    SFT (assistant-only loss: TRL's training template) trained on, past turns' empty think
    blocks included, as GRPO renders it; the tokenizer's own Qwen3 template drops them from
    past turns (the evaluation then read chats unlike its training: issue 51)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import get_training_chat_template

    from digirl_lite.envs.sim.trl_warmup import (
        ToolCallAgent,
        check_tool_template,
        expert_conversations,
    )

    data, _ = expert_conversations(n=3, seed=0, tasks=[TASK])
    tok = check_tool_template(AutoTokenizer.from_pretrained(tiny_dir))
    msgs, tools = data[0]["messages"], json.loads(data[0]["tools"])
    trained = tok.apply_chat_template(msgs, tools=tools, tokenize=False,
                                      chat_template=get_training_chat_template(tok))
    agent = ToolCallAgent(None, tok)
    turns = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
    assert len(turns) >= 3
    for k in turns:
        assert trained.startswith(agent.prompt(msgs[:k]))
    plain = tok.apply_chat_template(msgs[:turns[-1]], tools=tools, tokenize=False,
                                    add_generation_prompt=True, enable_thinking=False)
    assert not trained.startswith(plain)


@pytest.mark.slow
def test_recovery_rows_train_on_the_way_back_and_never_on_the_mistake(tiny_dir, tmp_path):
    """``recovery``: a mistake put in (a tap on an id the screen lacks, answered with the
    tools' note, or on another element) ends the row's prompt; the expert's way back from it
    is the completion and ends in success. TRL's SFTTrainer (assistant-only loss) puts labels
    on the completion's calls and on no token of the mistake's call or of any screen."""
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from digirl_lite.envs.sim.trl_warmup import check_tool_template, expert_conversations

    with pytest.raises(ValueError, match="recovery"):
        expert_conversations(n=1, tasks=[TASK], recovery=1.5)
    data, counts = expert_conversations(n=6, seed=0, tasks=[TASK], recovery=1.0)
    assert counts["recoveries"] >= 3 and counts["recoveries"] <= counts["kept"] == len(data)
    invented = 0
    for row in data:
        prompt, completion = row["prompt"], row["completion"]
        if len(prompt) == 2:  # the episode ended before its drawn step: no mistake
            continue
        mistake, answer = prompt[-2], prompt[-1]
        assert mistake["role"] == "assistant" and answer["role"] == "tool"
        element = json.loads(mistake["tool_calls"][0]["function"]["arguments"]).get("element")
        if answer["content"].startswith("There is no element"):
            invented += 1
            assert f"[{element}]" not in prompt[-3]["content"]  # not on the screen before
        assert completion[0]["role"] == "assistant"
        assert completion[-1]["content"].endswith("the task is done.")
    assert invented >= 1

    tok = check_tool_template(AutoTokenizer.from_pretrained(tiny_dir))
    cfg = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, assistant_only_loss=True,
                    max_length=None, report_to="none", use_cpu=True, save_strategy="no")
    trainer = SFTTrainer(model=str(tiny_dir), args=cfg, train_dataset=data,
                         processing_class=tok)
    def rendered(m):  # a call as the template writes it (see chat_text)
        f = m["tool_calls"][0]["function"]
        return json.dumps({"name": f["name"], "arguments": json.loads(f["arguments"])})

    for row, example in zip(data, trainer.train_dataset):
        trained = tok.decode([t for t in example["labels"] if t != -100])
        calls = [rendered(m) for m in row["completion"] if m["role"] == "assistant"]
        assert all(c in trained for c in calls)
        assert trained.count('"name"') == len(calls)  # no other call, the mistake's neither
        assert "Screen:" not in trained and "Task:" not in trained
        if len(row["prompt"]) > 2:
            assert rendered(row["prompt"][-2]) in calls or rendered(row["prompt"][-2]) \
                not in trained


def test_varied_episodes_type_a_made_up_product_their_task_names_and_succeed():
    """``varied``: that share of the expert's episodes run a train task whose product
    (General: whose names) is made up, so the text a successful episode types is one the
    train list never holds: copying it from the task is the only way to write it."""
    from digirl_lite.envs.sim.env import SimPhoneEnv
    from digirl_lite.envs.sim.trl_warmup import expert_conversations

    with pytest.raises(ValueError, match="varied"):
        expert_conversations(n=1, tasks=[TASK], varied=-0.1)
    for world in ("webshop", "general"):
        train = [t.text for t in SimPhoneEnv._load_task_list(world)]
        data, counts = expert_conversations(world, n=10, seed=1, max_nodes=20, varied=1.0)
        assert counts["varied"] >= 4, counts
        new = 0
        for row in data:
            task = row["messages"][1]["content"].split("Task: ", 1)[1].split("Goal:")[0]
            typed = [json.loads(m["tool_calls"][0]["function"]["arguments"])["text"]
                     for m in row["messages"] if m["role"] == "assistant"
                     and m["tool_calls"][0]["function"]["name"] == "type_text"]
            if task not in train:
                new += 1
                assert typed and typed[-1].lower() in task.lower()  # copied from the task
                assert not any(typed[-1].lower() in t.lower() for t in train) or world == \
                    "general"  # a made-up product is in no train task
        assert new >= 3


@pytest.mark.slow
def test_an_infrastructure_fault_is_no_reward_of_0_but_dropped_and_counted(tmp_path):
    """The server dies: the tool call raises (TRL hands the model the message), the
    episode's reward is None (TRL leaves it out of its group) and the class counts it; a
    start on a dead server is retried once on a new connection, then dropped the same way."""
    optional_import("openenv", 'pip install -e ".[openenv]"')
    from digirl_lite.envs.sim.openenv import LocalServer
    from digirl_lite.envs.sim.trl_tools import phone_tools

    srv = LocalServer(["--ui-tree", "--no-screenshot", "--log-level", "warning"])
    try:
        cls = phone_tools(srv.url)
        tools = cls()
        tools.reset(task=TASK, seed=1)
        tools.press_home()
        assert tools.get_reward() == 0.0 and cls.faults == 0
    finally:
        srv.stop()
    with pytest.raises(RuntimeError, match="infrastructure fault"):
        tools.press_home()
    assert tools.get_reward() is None and tools.fault and cls.faults == 1
    text = tools.reset(task=TASK, seed=2)
    assert "unavailable" in text and tools.get_reward() is None
    assert cls.faults == 2 and cls.retries == 1 and tools.done


@pytest.mark.slow
def test_the_recipe_warms_up_then_runs_grpo_and_evaluates_both(tmp_path, capsys):
    """``--tiny --warmup`` on a very small budget: SFT, the held-out evaluation (true rate
    beside the judged one, valid tool-call share), GRPO, the evaluation again, the table."""
    optional_import("openenv", 'pip install -e ".[openenv]"')
    recipe = _recipe()
    s = recipe.main(["--tiny", "--warmup", "--sft-episodes", "2", "--sft-steps", "2",
                     "--sft-batch", "1", "--max-steps", "1", "--batch", "2",
                     "--num-generations", "2", "--max-completion-length", "64", "--tasks", "2",
                     "--eval-tasks", "2", "--eval-envs", "2", "--out", str(tmp_path),
                     "--tiny-set", "vocab_size=768", "hidden_size=32", "--grpo-filter", "2"])
    assert set(s["stages"]) == {"sft", "grpo"}
    f = s["phases"]["grpo_filter"]  # 2 sampled episodes of each of the 2 train tasks
    assert f["tasks"] == 2 and f["episodes_per_task"] == 2
    assert f["kept"] + f["solved_never"] + f["solved_always"] + f["not_measured"] == 2
    assert len(f["kept_tasks"]) == f["kept"]
    assert f["kept"] or "no gradient" in f["note"]  # none left: said, not hidden
    for key in ("before", "after"):
        r = s[key]
        assert r["episodes"] == 2 and 0 <= r["true_success_rate"] <= 1
        assert 0 <= r["valid_tool_call_share"] <= 1
    assert s["phases"]["sft"]["steps"] == 2 and s["phases"]["grpo"]["steps"] == 1
    assert s["phases"]["sft"]["data"]["kept"] >= 1 and s["infrastructure"]["faults"] == 0
    out = capsys.readouterr().out
    assert "held-out success" in out and "sft" in out and "grpo" in out and "[true" in out
    assert (tmp_path / "sft" / "config.json").is_file()
    sizes = json.loads((tmp_path / "tiny_model" / "tiny_lm.json").read_text())
    assert sizes["vocab_size"] == 768 and sizes["hidden_size"] == 32
    assert s["settings"]["tiny_set"] == ["vocab_size=768", "hidden_size=32"]


def test_pass_counts_count_each_task_by_its_place_not_its_text():
    """Each of 3 tasks run k=3 times in a row (episode j is task j // 3, by the number its
    trajectory id ends with, in any order): two tasks with the same text ("Go to ebay.com",
    as the Web Shopping train list repeats it) count apart; a task missing an episode, or
    with one without a truth, is not measured (None), not a count of failures."""
    from types import SimpleNamespace

    from digirl_lite.envs.sim.trl_warmup import pass_counts

    def ep(j, truth):
        return SimpleNamespace(trajectory=SimpleNamespace(traj_id=f"eval-{j:05d}",
                                                          true_success=truth))

    runs = [ep(0, True), ep(1, False), ep(2, True),      # "Go to ebay.com": 2 of 3
            ep(5, True), ep(3, True), ep(4, True),       # "Go to ebay.com" again: 3 of 3
            ep(6, False), ep(7, False), ep(8, False)]    # a search: 0 of 3
    assert pass_counts(runs, 3, 3) == [2, 3, 0]
    assert pass_counts(runs[:-1], 3, 3) == [2, 3, None]  # an episode given up on
    runs[1] = ep(1, None)
    assert pass_counts(runs, 3, 3) == [None, 3, 0]  # an episode with no truth


def test_tiny_warmup_runs_the_setting_the_3_seed_table_measured():
    """``--tiny --warmup`` with nothing else is the setting of every seed of
    ``benchmarks/results/trl_grpo.json`` (the table the docs quote); an argument given wins;
    a smoke run (``--tiny``) and a ``--model`` keep the base defaults."""
    recipe = _recipe()
    table = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results"
                        / "trl_grpo.json").read_text())
    _, args = recipe.parse_args(["--tiny", "--warmup"])
    assert args.defaults == "tiny_warmup"
    for seed, run in table["seeds"].items():
        differ = {k: (v, getattr(args, k)) for k, v in run["settings"].items()
                  if k != "seed" and getattr(args, k) != v}
        assert not differ, f"seed {seed}'s setting is not the default: {differ}"
    _, args = recipe.parse_args(["--tiny", "--warmup", "--world", "webshop", "--sft-steps", "7"])
    assert (args.world, args.sft_steps, args.sft_batch) == ("webshop", 7, 1)
    for argv in (["--tiny"], ["--model", "some/dir", "--warmup"]):
        _, args = recipe.parse_args(argv)
        assert args.defaults == "base"
        assert {k: getattr(args, k) for k in recipe.BASE} == recipe.BASE


def test_grpo_filter_needs_two_episodes_per_task_and_the_warmup(capsys):
    """``--grpo-filter K`` samples the SFT model: refused without ``--warmup`` or with K < 2
    (a task solved in 0 < s < 1 episodes does not exist), before anything runs."""
    recipe = _recipe()
    for argv in (["--tiny", "--grpo-filter", "4"], ["--tiny", "--warmup", "--grpo-filter", "1"]):
        with pytest.raises(SystemExit):
            recipe.main(argv)
        assert "--grpo-filter" in capsys.readouterr().err


def _recipe():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "recipes" / "trl_grpo.py"
    spec = importlib.util.spec_from_file_location("trl_grpo", path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    return recipe


def test_the_evaluation_agent_reuses_each_slots_cache_and_replies_as_a_fresh_encode(tiny_dir):
    """Each slot keeps its chat's key-value cache, so a turn encodes only the tokens after
    what the cache holds; cut back where a new prompt departs from it (a re-rendered turn, a
    new episode), and the reply is the one a fresh encode of the whole prompt gives."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from digirl_lite.envs.sim.trl_warmup import ToolCallAgent, check_tool_template

    tok = check_tool_template(AutoTokenizer.from_pretrained(tiny_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    words = tok("Task: search for logitech g910 on ebay, then open the first result",
                add_special_tokens=False)["input_ids"]
    first = words * 3
    agent = ToolCallAgent(model, tok, max_new_tokens=6)
    reply = agent._continue(0, first)
    assert agent.reused == 0 and agent.encoded == len(first)
    turns = [first + reply + words,            # the next turn: the cache holds the prefix
             first + reply[:2] + words[::-1],  # departs inside the reply: cut back
             words[:3] + first]                # a new episode sharing little
    shared = [len(first), len(first) + 2, 3]  # at least this much read from the cache
    for prompt, least in zip(turns, shared):
        before = agent.reused
        got = agent._continue(0, prompt)
        fresh = ToolCallAgent(model, tok, max_new_tokens=6)._continue(0, prompt)
        assert got == fresh
        assert len(got) >= 1
        assert least <= agent.reused - before < len(prompt)
    assert agent.reused + agent.encoded == sum(map(len, [first] + turns))
    # the second slot has its own cache
    other = agent._continue(1, first)
    assert other == reply and agent.caches[1][0] is not agent.caches[0][0]
