"""The SFT warm-up and the held-out evaluation of TRL's GRPO recipe (issue 51).

A model TRL's ``GRPOTrainer`` drives through :func:`~.trl_tools.phone_tools` must first write
tool calls at all: a random or untuned model writes none, and then no reward ever reaches it.
This module gives the three pieces around GRPO, all in the recipe's chat format (the system
prompt and ``Task: ...`` with the first screen appended, as TRL appends ``reset``'s return to
the last user turn; then assistant turns that call one tool, and tool turns that answer with
the next screen):

* :func:`expert_conversations`: the scripted expert's episodes written as such chats, the
  SFT data (imitation data: the expert reads the simulator's state to choose; the chat holds
  only what the model is shown, the UI tree text). A tap becomes a tap on the smallest
  clickable element of the shown tree under the expert's point.
* :class:`ToolCallAgent`: a causal LM behind the fleet's batch interface, reading the same
  chat and acting through :func:`~.trl_tools.tool_action` (the tools' own mapping), so the
  package's evaluation (:func:`digirl_lite.train.evaluate.evaluate`: the true rate beside the
  judged one, failure kinds) measures what GRPO trains. It also counts the share of its
  replies that were a valid tool call.
* :func:`check_tool_template`: a model directory whose chat template cannot render tools or
  whose replies TRL cannot parse tool calls from is refused before any training.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from digirl_lite.actions import parse_action
from digirl_lite.envs.sim.trl_tools import (
    HEIGHT,
    KEY_TOOLS,
    SYSTEM_PROMPT,
    TOOL_NAMES,
    WIDTH,
    observation_text,
    phone_tools,
    tool_action,
)

__all__ = ["ToolTemplateError", "tool_schemas", "expert_conversations", "chat_text",
           "check_tool_template", "ToolCallAgent"]

_KEY_TOOLS = {key: tool for tool, key in KEY_TOOLS.items()}  # action type -> its tool


class ToolTemplateError(ValueError):
    """A model whose tokenizer cannot write or read tool calls in TRL's loop."""


def tool_schemas() -> list[dict[str, Any]]:
    """The JSON schemas of the phone's tools, as TRL renders them into the chat template
    (from the methods' docstrings, in TRL's order: by name)."""
    from transformers.utils import get_json_schema

    cls = phone_tools("http://unused")
    bare = object.__new__(cls)  # no session: only the bound methods' signatures are read
    return [get_json_schema(getattr(bare, name)) for name in TOOL_NAMES]


def _shown(obs: dict[str, Any], info: dict[str, Any], done: bool) -> Any:
    """What :func:`observation_text` reads, from the Gymnasium env's observation."""
    return SimpleNamespace(goal=obs["goal"], step=int(obs["step"]), ui_tree=obs.get("ui_tree"),
                           invalid_reason=info.get("invalid_reason"), done=done,
                           success=bool(info.get("success", False)))


def _expert_call(action, tree: str) -> dict[str, Any] | None:
    """The tool call standing for the expert's action on the shown tree (None: a tap on a
    point no shown clickable element covers)."""
    from digirl_lite.envs.uitree import parse_tree_text

    kind = action.action_type.value
    if kind == "DUAL_POINT":
        y, x = action.touch_yx
        nodes = [n for n in parse_tree_text(tree) if n.bounds[0] <= x * WIDTH <= n.bounds[2]
                 and n.bounds[1] <= y * HEIGHT <= n.bounds[3]]
        if not nodes:
            return None
        # the smallest clickable element under the point (else the smallest element: the
        # expert also taps the status bar, as a wait)
        node = min(nodes, key=lambda n: (not n.clickable, (n.bounds[2] - n.bounds[0])
                                         * (n.bounds[3] - n.bounds[1])))
        return {"name": "tap", "arguments": {"element": node.id}}
    if kind == "TYPE":
        return {"name": "type_text", "arguments": {"text": action.typed_text}}
    if kind in _KEY_TOOLS:
        return {"name": _KEY_TOOLS[kind], "arguments": {}}
    return None


def expert_conversations(world: str = "webshop", n: int = 64, seed: int = 0,
                         max_nodes: int = 40, tasks: Sequence[str] | None = None,
                         recovery: float = 0.0, varied: float = 0.0
                         ) -> tuple[Any, dict[str, int]]:
    """``n`` episodes of the scripted expert on ``world``'s train tasks (or ``tasks``), each
    a row ``messages`` (the chat, see the module docstring) and ``tools`` (the schemas, as
    JSON), on the phone the recipe serves (surprises on, the same ``max_nodes``); only the
    episodes the expert completes are kept. Returns the ``datasets.Dataset`` and counts:
    ``episodes``, ``kept``, ``steps``, ``untranslatable`` (episodes with a tap no shown
    element covers, dropped), ``recoveries`` (kept episodes with a mistake put in).

    ``recovery``: the share of episodes with one mistake put in at a step drawn from the
    first eight (noise injection, as DART does for imitation): a tap on an element id the
    screen does not have (one an earlier screen of the data showed; the phone answers with
    the tools' note) or on another clickable element of the screen. The expert goes on from
    wherever the mistake led. With ``recovery`` > 0 every row is a ``prompt`` and a
    ``completion`` (TRL's prompt-completion form: the loss is on the completion's assistant
    turns): a row with a mistake has the chat up to the mistake's answer as its prompt, so
    SFT learns the way back and never the mistake itself; the others have the system and
    first user turns as their prompt, which trains on the same tokens as ``messages`` rows.

    ``varied``: the share of episodes whose task has its product replaced by a made-up one
    (Web Shopping, :func:`~digirl_lite.envs.sim.drills.vary_products`; General: each
    search's names, :func:`~digirl_lite.envs.sim.drills.vary_queries`), as the Auto-UI
    starting policy's demonstrations do: on the train list's few hundred products and
    places a model from scratch learns to type the ones it saw, not to copy what the task
    says. Counted in ``varied``.
    """
    import random

    from datasets import Dataset

    from digirl_lite.envs.sim.agents import ScriptedExpert
    from digirl_lite.envs.sim.gym import SimPhoneGymEnv

    if tasks is None:
        from digirl_lite.envs.sim.env import SimPhoneEnv

        tasks = [t.text for t in SimPhoneEnv._load_task_list(world)]
        random.Random(seed).shuffle(tasks)
    for name, share in (("recovery", recovery), ("varied", varied)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name}: a share in [0, 1], got {share!r}")
    made_up: list[str] = []
    if varied:  # train tasks drawn at random, each with new names (the pools: all of them)
        from digirl_lite.envs.sim.drills import vary_products, vary_queries

        made_up = (vary_queries if world == "general" else vary_products)(list(tasks), n,
                                                                          seed=seed)
    vrng, known = random.Random(f"varied|{seed}"), set(tasks)
    from digirl_lite.envs.uitree import parse_tree_text

    env = SimPhoneGymEnv(world=world, ui_tree=True, max_nodes=max_nodes, screen_size=(48, 24))
    schemas = json.dumps(tool_schemas())
    rows, counts = [], {"episodes": 0, "kept": 0, "steps": 0, "untranslatable": 0,
                        "recoveries": 0, "varied": 0}
    seen_ids: dict[str, None] = {}  # element ids of the screens so far (invented-id mistakes)
    rng = random.Random(f"recovery|{seed}")
    for k in range(n):
        task = tasks[k % len(tasks)]
        if varied and vrng.random() < varied:
            task = made_up[k]
            counts["varied"] += task not in known  # one without a product or name stays
        obs, info = env.reset(seed=10_000 * seed + 5_000 + k, options={"task": task})
        first = observation_text(_shown(obs, info, False))
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": f"Task: {task}" + first}]
        mistake_at = rng.randrange(8) if rng.random() < recovery else None
        prompt_end = 2  # where the completion starts (after a mistake's answer)
        expert, done, ok, step = ScriptedExpert(), False, True, 0
        while not done:
            call = _expert_call(parse_action(expert.act(env._obs)), obs["ui_tree"])
            if call is None:
                ok = False
                break
            if recovery:  # the screen's elements: for a mistake here, or one later
                shown = parse_tree_text(obs["ui_tree"] or "")
                on_screen = {node.id for node in shown}
                if step == mistake_at:
                    call = _mistake(call, shown, [i for i in seen_ids if i not in on_screen],
                                    rng)
                seen_ids.update(dict.fromkeys(on_screen))
            text, note = tool_action(call["name"], call["arguments"], obs["ui_tree"])
            obs, _, terminated, truncated, info = env.step(text)
            done = terminated or truncated
            messages.append({"role": "assistant", "content": "",
                             "tool_calls": [{"type": "function", "function": {
                                 "name": call["name"],
                                 "arguments": json.dumps(call["arguments"])}}]})
            messages.append({"role": "tool", "name": call["name"],
                             "content": (note + "\n" if note else "")
                             + observation_text(_shown(obs, info, done))})
            if step == mistake_at:
                prompt_end = len(messages)
            step += 1
        counts["episodes"] += 1
        if not ok:
            counts["untranslatable"] += 1
            continue
        if not info.get("success") or (prompt_end > 2 and prompt_end == len(messages)):
            continue  # failed, or over at the mistake: nothing to learn after it
        counts["kept"] += 1
        counts["recoveries"] += prompt_end > 2
        counts["steps"] += (len(messages) - prompt_end) // 2
        rows.append({"prompt": messages[:prompt_end], "completion": messages[prompt_end:],
                     "tools": schemas} if recovery else {"messages": messages, "tools": schemas})
    env.close()
    return Dataset.from_list(rows), counts


def pass_counts(episodes: Sequence[Any], n_tasks: int, k: int) -> list[int | None]:
    """Successes (true) per task of an evaluation that ran each of ``n_tasks`` tasks ``k``
    times in a row: episode ``j`` (the number its trajectory id ends with, as
    :meth:`~digirl_lite.rollout.fleet.SyncFleet.collect` numbers them) is of task ``j // k``,
    so tasks whose texts repeat (the Web Shopping train list's "Go to ...") count apart. A
    task with fewer than ``k`` episodes back (the fleet gave one up to an infrastructure fault)
    or one without a truth is None: not measured, rather than a count of failures."""
    wins: list[int | None] = [0] * n_tasks
    seen = [0] * n_tasks
    for e in episodes:
        j = int(e.trajectory.traj_id.rsplit("-", 1)[1]) // k
        seen[j] += 1
        truth = e.trajectory.true_success
        if truth is None:
            wins[j] = None
        elif wins[j] is not None:
            wins[j] += bool(truth)
    return [w if n == k else None for w, n in zip(wins, seen)]


def _mistake(call: dict[str, Any], shown: Sequence[Any], elsewhere: Sequence[str],
             rng: Any) -> dict[str, Any]:
    """A wrong call in place of the expert's ``call`` on a screen whose elements are
    ``shown``: a tap on an element id only other screens had (``elsewhere``; half the time
    when there is one), else a tap on another clickable element of this screen (or, with
    none, ``press_back``)."""
    target = call["arguments"].get("element") if call["name"] == "tap" else None
    if elsewhere and rng.random() < 0.5:
        return {"name": "tap", "arguments": {"element": rng.choice(list(elsewhere))}}
    others = [node.id for node in shown if node.clickable and node.id != target]
    if others:
        return {"name": "tap", "arguments": {"element": rng.choice(others)}}
    return {"name": "press_back", "arguments": {}}


def chat_text(data: Any) -> list[str]:
    """The lines a tiny model's tokenizer should be trained on to read and write this
    recipe's chats compactly: the system prompt, the tool schemas (as rendered) and every line
    of every message and tool call of ``data`` (rows of :func:`expert_conversations`). A
    tokenizer trained on the simulator's action strings alone spends more tokens per episode
    on the screens and tool list it never saw (issue 51): slower SFT, longer chats."""
    lines = [SYSTEM_PROMPT, json.dumps(tool_schemas())]
    for row in data:
        for m in row.get("messages") or list(row["prompt"]) + list(row["completion"]):
            lines += [line for line in str(m.get("content") or "").split("\n") if line]
            for c in m.get("tool_calls") or []:
                f = c.get("function", {})
                args = f.get("arguments") or {}
                args = json.loads(args) if isinstance(args, str) else args
                lines.append(json.dumps({"name": f.get("name"), "arguments": args}))  # as rendered
    return lines


def check_tool_template(tok: Any) -> Any:
    """``tok`` with TRL's response parser set, after checking that its chat template renders
    the phone's tools and tool turns and that a tool call it renders parses back.

    Raises:
        ToolTemplateError: no chat template, one that ignores the tools or the calls, or no
            parser TRL knows for it (naming what to do).
    """
    if not getattr(tok, "chat_template", None):
        raise ToolTemplateError(
            "the model's tokenizer has no chat template: TRL's GRPOTrainer writes the phone's "
            "tools into the chat template and parses tool calls from the replies; use an "
            "instruct/chat checkpoint (Qwen2.5, Qwen3, Llama 3.1/3.2, ...)")
    try:
        from trl.chat_template_utils import add_response_schema, parse_response
    except ImportError as e:
        raise ImportError("TRL's tool calling needs TRL: pip install 'digirl-lite[trl]'") from e
    call = {"name": "tap", "arguments": {"element": "icon:chrome"}}
    msgs = [{"role": "user", "content": "Task: x"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": call}]}]
    try:
        text = tok.apply_chat_template(msgs, tools=tool_schemas(), tokenize=False)
    except Exception as e:  # noqa: BLE001 - jinja errors of every kind
        raise ToolTemplateError(f"the model's chat template cannot render tool calls: "
                                f"{type(e).__name__}: {e}") from e
    if "task_complete" not in text or "icon:chrome" not in text:
        raise ToolTemplateError("the model's chat template ignores the tools or the tool calls "
                                "(it renders neither the tool list nor the call): it cannot "
                                "write tool calls TRL reads")
    try:
        tok = add_response_schema(tok)
    except Exception as e:  # noqa: BLE001
        raise ToolTemplateError(f"TRL knows no tool-call parser for this chat template "
                                f"({type(e).__name__}: {e})") from e
    prompt = tok.apply_chat_template(msgs[:1], tools=tool_schemas(), tokenize=False,
                                     add_generation_prompt=True, enable_thinking=False)
    reply = text[len(prompt):] if text.startswith(prompt) else text
    parsed = parse_response(tok, tok(reply, add_special_tokens=False)["input_ids"],
                            prefix=tok(prompt, add_special_tokens=False)["input_ids"])
    got = [c.get("function", {}) for c in parsed.get("tool_calls") or []]
    if not got or got[0].get("name") != "tap":
        raise ToolTemplateError("a tool call the chat template renders does not parse back "
                                f"with TRL's parser (got {parsed!r:.200})")
    return tok


class ToolCallAgent:
    """A causal LM acting on fleet observations through tool calls (the batch interface,
    :class:`~digirl_lite.rollout.fleet_types.BatchAgent`).

    Each slot keeps the chat of its episode in the GRPO recipe's format; a reply is parsed
    with TRL's parser and its first tool call mapped to an action by
    :func:`~.trl_tools.tool_action`. A reply without a valid tool call (no call, an unknown
    tool, a tap on an element the screen does not have) is an unparseable step. Greedy
    decoding unless ``sample``. ``valid`` / ``replies`` count the valid tool calls. Each slot
    keeps its chat's key-value cache (:meth:`_continue`), valid for the weights it was built
    with: after the model trains, make a new agent (as ``evaluate_tool_model`` of the
    GRPO recipe does for each evaluation).
    """

    def __init__(self, model: Any, tok: Any, *, max_nodes: int = 40,
                 max_new_tokens: int = 48, sample: bool = False,
                 max_completion_length: int | None = None) -> None:
        from trl.chat_template_utils import (
            add_response_schema,
            get_training_chat_template,
            is_chat_template_prefix_preserving,
        )

        self.model, self.tok = model, add_response_schema(tok)
        # the chat as GRPOTrainer renders it with tools (and SFTTrainer with assistant-only
        # loss): a template that is not prefix-preserving (Qwen3's drops the empty think
        # block of past turns) swapped for TRL's training one, which keeps it on every turn;
        # the original renders past turns unlike anything trained on (issue 51)
        self.chat_template = (None if is_chat_template_prefix_preserving(self.tok)
                              else get_training_chat_template(self.tok))
        self.tok.padding_side = "left"
        self.max_nodes, self.max_new_tokens, self.sample = max_nodes, max_new_tokens, sample
        self.tools = tool_schemas()
        self.chats: dict[int, list[dict[str, Any]]] = {}
        self.trees: dict[int, str] = {}
        self.notes: dict[int, tuple[str, str | None]] = {}
        self.max_completion_length = max_completion_length
        self.prompt_length: dict[int, int] = {}
        self.over: set[int] = set()
        self.replies = 0
        self.valid = 0
        self.caches: dict[int, tuple[Any, list[int]]] = {}  # slot: (cache, its tokens)
        self.reused = 0  # prompt tokens read from a slot's cache
        self.encoded = 0  # prompt tokens encoded

    def _text(self, slot: int, obs: Any) -> str:
        from digirl_lite.envs.uitree import tree_text

        tree = tree_text(obs.ui_tree or (), self.max_nodes)
        self.trees[slot] = tree
        note, invalid = self.notes.pop(slot, ("", None))
        shown = SimpleNamespace(goal=obs.task, step=obs.step, ui_tree=tree,
                                invalid_reason=invalid, done=False, success=False)
        return (note + "\n" if note else "") + observation_text(shown)

    def act_batch(self, slots: Sequence[int], observations: Sequence[Any]) -> list[str]:
        for slot, obs in zip(slots, observations):
            text = self._text(slot, obs)
            if obs.step == 0 or slot not in self.chats:
                self.chats[slot] = [{"role": "system", "content": SYSTEM_PROMPT},
                                    {"role": "user", "content": f"Task: {obs.task}" + text}]
                self.prompt_length.pop(slot, None)
                self.over.discard(slot)
            else:
                last = self.chats[slot][-1]
                name = (last.get("tool_calls") or [{}])[0].get("function", {}).get("name")
                self.chats[slot].append({"role": "tool", "name": name or "none",
                                         "content": text})
        prompts = {s: self.tok(self.prompt(self.chats[s]), add_special_tokens=False)["input_ids"]
                   for s in slots if s not in self.over}
        if self.max_completion_length:
            for s in list(prompts):
                n = len(prompts[s])
                first = self.prompt_length.setdefault(s, n)
                if n - first > self.max_completion_length:
                    self.over.add(s)
                    del prompts[s]
        actions = {s: "no tool call: past the episode's token budget" for s in slots
                   if s not in prompts}
        live = [s for s in slots if s in prompts]
        if live:
            actions.update(zip(live, self._generate(live, [prompts[s] for s in live])))
        return [actions[s] for s in slots]

    def prompt(self, chat: list[dict[str, Any]]) -> str:
        """The text the model continues: ``chat`` with the tools, as GRPO renders it."""
        return self.tok.apply_chat_template(chat, tools=self.tools,
                                            chat_template=self.chat_template, tokenize=False,
                                            add_generation_prompt=True, enable_thinking=False)

    def _generate(self, slots: Sequence[int], prompts: list[list[int]]) -> list[str]:
        from trl.chat_template_utils import parse_response

        actions = []
        eos = self.tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in self.tok.get_vocab() \
            else self.tok.eos_token_id
        for slot, prefix in zip(slots, prompts):
            ids = self._continue(slot, prefix)
            if eos in ids:
                ids = ids[:ids.index(eos) + 1]
            msg = parse_response(self.tok, ids, prefix=prefix, tools=self.tools)
            calls = [c.get("function", {}) for c in msg.get("tool_calls") or []]
            self.replies += 1
            if calls and calls[0].get("name") in TOOL_NAMES \
                    and isinstance(calls[0].get("arguments", {}), dict):
                call = calls[0]
                text, note = tool_action(call["name"], call.get("arguments") or {},
                                         self.trees[slot])
                self.chats[slot].append({"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": call["name"],
                                                      "arguments": call.get("arguments") or {}}}]})
            else:
                text = "no tool call"
                note = "There was no tool call: act with one of the tools."
                self.chats[slot].append({"role": "assistant",
                                         "content": str(msg.get("content", ""))[:500]})
            is_valid = parse_action(text).is_valid
            self.valid += is_valid
            if not is_valid:
                self.notes[slot] = (note, text)
            actions.append(text)
        return actions

    def _continue(self, slot: int, prefix: list[int]) -> list[int]:
        """The model's reply to ``prefix`` (token ids), one slot at a time: each slot keeps the
        key-value cache of its chat, so a turn encodes only the tokens its cache does not hold
        (the new screen), not the whole chat again; the cache is cut back to the longest
        common prefix of what it holds and ``prefix`` (an assistant turn re-rendered from the
        parsed call, a new episode after the system prompt and tools). Each turn used to
        re-encode every slot's whole chat, left-padded to the longest: 547 of 627 s of a
        profiled evaluation were that attention (issue 51)."""
        from os.path import commonprefix

        import torch
        from transformers import DynamicCache

        cache, held = self.caches.get(slot, (None, []))
        same = min(len(commonprefix([held, prefix])), len(prefix) - 1)  # >= 1 token to encode
        if cache is None or same == 0:
            cache = DynamicCache(config=self.model.config)
        else:
            cache.crop(same - cache.get_seq_length())  # tokens to remove, <= 0
        self.reused += same
        self.encoded += len(prefix) - same
        ids = torch.tensor([prefix], dtype=torch.long, device=self.model.device)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      cache=cache,
                                      max_new_tokens=self.max_new_tokens,
                                      do_sample=self.sample, pad_token_id=self.tok.pad_token_id)
        full = out[0].tolist()
        self.caches[slot] = (cache, full[:cache.get_seq_length()])
        return full[len(prefix):]

    @property
    def valid_share(self) -> float:
        return self.valid / self.replies if self.replies else float("nan")
