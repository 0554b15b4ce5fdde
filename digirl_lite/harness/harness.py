"""A harness around a frozen agent: H = H0 (+) additive edits (spec/DARWIN.md section B).

The evolvable parts are named text components, a ``dict[str, str]`` (the form GEPA
optimises, :mod:`digirl_lite.harness.darwinx`):

- ``system_prompt``: what a prompted agent (:mod:`digirl_lite.harness.llm`) is told;
- ``psi`` (context processing, JSON): ``history`` (how many previous actions a prompted
  agent reads), ``tree`` (whether it reads the UI tree), ``max_nodes``;
- ``xi`` (action projection, JSON): ``repair`` (rebuild an output that does not parse from
  the fields it does hold), ``retry`` (one constrained retry of an output that still does
  not parse), ``snap`` (a tap on no clickable element moves to the nearest clickable one
  within ``snap_px`` pixels);
- ``skills``: rules (:mod:`digirl_lite.harness.rules`), one JSON object per line.

A :class:`Harness` is H0 plus a list of :class:`Edit` with their provenance; an edit adds
behaviour and never deletes what its parent had (a rule is appended, a prompt paragraph is
appended, an ``xi`` switch only turns on). :class:`HarnessAgent` runs a harness around any
:class:`StepAgent` (a :class:`PolicyAgent` wrapping a trained :class:`~digirl_lite.policy.Policy`,
or a prompted VLM) behind the fleets' batch interface, and marks every step with who decided
it (``Step.decided_by``: ``agent``, ``rule:<id>``, ``xi:repair`` / ``xi:retry`` /
``xi:snap``), so a harness that simply replaces the agent shows in every report.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from digirl_lite.actions import Action, ActionType, format_action, parse_action
from digirl_lite.data.records import screen_id_of_image
from digirl_lite.envs.base import Observation
from digirl_lite.harness.rules import (
    RuleError,
    StepContext,
    decide,
    parse_rules,
)
from digirl_lite.rollout.episode import SampledAction

__all__ = ["Harness", "Edit", "EditError", "HarnessAgent", "StepAgent", "AgentInput",
           "PolicyAgent", "BatchStepAgent", "H0_COMPONENTS", "COMPONENTS", "EDIT_TARGETS",
           "AGENT_COMPONENTS", "repair_action", "candidate_id", "check_components",
           "check_readable", "decision_shares"]

COMPONENTS = ("system_prompt", "psi", "xi", "skills")
DEFAULT_SYSTEM_PROMPT = (
    "You operate an Android phone to complete the user's task. Each turn you see the "
    "screenshot and the screen's UI elements, and answer with exactly one action in the "
    "format: Action Decision: \"action_type\": \"DUAL_POINT\" | \"TYPE\" | \"PRESS_BACK\" | "
    "\"PRESS_HOME\" | \"PRESS_ENTER\" | \"STATUS_TASK_COMPLETE\" | \"TASK_IMPOSSIBLE\", "
    "\"touch_point\": \"[y, x]\", \"lift_point\": \"[y, x]\", \"typed_text\": \"...\" "
    "(points normalised to [0, 1], y first).")
PSI_DEFAULT = {"history": 1, "tree": True, "max_nodes": 60}
XI_DEFAULT = {"repair": False, "retry": False, "snap": False, "snap_px": 160}
H0_COMPONENTS: dict[str, str] = {
    "system_prompt": DEFAULT_SYSTEM_PROMPT,
    "psi": json.dumps(PSI_DEFAULT),
    "xi": json.dumps(XI_DEFAULT),
    "skills": "",
}
"""H0: the agent as it is (no repair, no retry, no snapping, no rules)."""
EDIT_TARGETS = {"skill": "skills", "prompt": "system_prompt", "xi": "xi", "psi": "psi"}
"""The component each edit kind changes."""
AGENT_COMPONENTS = ("system_prompt", "psi")
"""The components that act only through the agent's input (:class:`AgentInput`): an agent
that does not read them (:attr:`StepAgent.reads`) is untouched by their edits. ``skills``
and ``xi`` act around the agent, on any agent."""


class EditError(ValueError):
    """An edit (or a set of components) that cannot be applied; says what and where."""


def _json_obj(text: str, name: str, defaults: dict[str, Any]) -> dict[str, Any]:
    try:
        d = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise EditError(f"component {name!r} is not JSON (line {e.lineno}, column "
                        f"{e.colno}: {e.msg})") from None
    if not isinstance(d, dict):
        raise EditError(f"component {name!r} must be a JSON object")
    bad = [k for k in d if k not in defaults]
    if bad:
        raise EditError(f"component {name!r}: unknown key(s) {bad}; known: {list(defaults)}")
    out = {**defaults, **d}
    for k, v in out.items():
        want = type(defaults[k])
        if not isinstance(v, want) or (want is int and isinstance(v, bool)):
            raise EditError(f"component {name!r}: {k} must be {want.__name__}, got {v!r}")
    if name == "psi" and not (0 <= out["history"] <= 20 and 1 <= out["max_nodes"] <= 500):
        raise EditError(f"component 'psi': history must be 0-20 and max_nodes 1-500, got {out}")
    if name == "xi" and not 0 <= out["snap_px"] <= 2000:
        raise EditError(f"component 'xi': snap_px must be 0-2000, got {out['snap_px']}")
    return out


def check_components(components: dict[str, str], where: str = "harness"
                     ) -> tuple[dict, dict, list]:
    """Parse and check every component: ``(psi, xi, rules)``.

    Raises:
        EditError: a component that is missing, not text, or does not parse (a rule's
            error names ``where`` and the line).
    """
    if not isinstance(components, dict):
        raise EditError(f"{where}: components must be a dict of text, got "
                        f"{type(components).__name__}")
    missing = [c for c in COMPONENTS if c not in components]
    extra = [c for c in components if c not in COMPONENTS]
    if missing or extra:
        raise EditError(f"{where}: components must be {list(COMPONENTS)} (missing {missing}, "
                        f"unknown {extra})")
    for k, v in components.items():
        if not isinstance(v, str):
            raise EditError(f"{where}: component {k!r} must be text, got {type(v).__name__}")
    psi = _json_obj(components["psi"], "psi", PSI_DEFAULT)
    xi = _json_obj(components["xi"], "xi", XI_DEFAULT)
    try:
        rules = parse_rules(components["skills"], source=f"{where}: skills")
    except RuleError as e:
        raise EditError(str(e)) from None
    return psi, xi, rules


def candidate_id(components: dict[str, str]) -> str:
    """A short content hash of a harness's components (equal ids: equal harnesses)."""
    blob = json.dumps({k: components[k] for k in sorted(components)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Edit:
    """One additive edit.

    ``kind``: ``"skill"`` (``content``: rule lines to append), ``"prompt"`` (a paragraph
    to append to the system prompt), ``"xi"`` / ``"psi"`` (a JSON object of settings; an
    ``xi`` switch may only turn on). ``provenance``: who proposed it and from what evidence
    (``{"proposer": ..., "evidence": "failure" | "teacher" | "self" | ..., ...}``).
    """

    kind: str
    content: str
    provenance: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "content": self.content, "provenance": dict(self.provenance)}

    @classmethod
    def from_dict(cls, d: Any, where: str = "edit") -> Edit:
        if not isinstance(d, dict) or not isinstance(d.get("kind"), str) \
                or not isinstance(d.get("content"), str):
            raise EditError(f"{where}: an edit is {{\"kind\": str, \"content\": str, "
                            f"\"provenance\": {{...}}}}, got {str(d)[:200]!r}")
        prov = d.get("provenance") or {}
        if not isinstance(prov, dict):
            raise EditError(f"{where}: provenance must be an object")
        return cls(d["kind"], d["content"], dict(prov))

    def apply(self, components: dict[str, str], where: str = "edit") -> dict[str, str]:
        """The components with this edit applied (checked).

        Raises:
            EditError: an unknown kind, a rule or setting that does not parse, a rule id
                the parent already has, or an edit that would take behaviour away.
        """
        out = dict(components)
        if self.kind == "skill":
            try:
                new = parse_rules(self.content, source=where if "(skill)" in where
                                  else f"{where} (skill)")
            except RuleError as e:
                raise EditError(str(e)) from None
            if not new:
                raise EditError(f"{where}: a skill edit holds no rule")
            have = {r.id for r in parse_rules(out["skills"], source="parent skills")}
            clash = [r.id for r in new if r.id in have]
            if clash:
                raise EditError(f"{where}: rule id(s) {clash} already in the parent")
            base = out["skills"]
            out["skills"] = base + ("" if not base or base.endswith("\n") else "\n") \
                + "".join(r.line() + "\n" for r in new)
        elif self.kind == "prompt":
            if not self.content.strip():
                raise EditError(f"{where}: an empty prompt edit")
            out["system_prompt"] = out["system_prompt"].rstrip() + "\n\n" + self.content.strip()
        elif self.kind in ("xi", "psi"):
            defaults = XI_DEFAULT if self.kind == "xi" else PSI_DEFAULT
            change = _json_obj(self.content, f"{where} ({self.kind})",
                               {k: v for k, v in defaults.items()})
            # only the keys the edit names (the rest were filled from the defaults)
            named = json.loads(self.content)
            cur = _json_obj(out[self.kind], self.kind, defaults)
            if self.kind == "xi":
                off = [k for k in ("repair", "retry", "snap") if k in named
                       and cur[k] and not change[k]]
                if off:
                    raise EditError(f"{where}: an edit may not turn off {off} (preserve "
                                    "and extend)")
            cur.update({k: change[k] for k in named})
            out[self.kind] = json.dumps(cur)
        else:
            raise EditError(f"{where}: unknown edit kind {self.kind!r}; use skill, prompt, "
                            "xi or psi")
        check_components(out, where)
        return out


def check_readable(edits: Sequence[Edit], reads: Collection[str], agent: str,
                   where: str = "proposal") -> None:
    """Refuse edits that would change a component the agent cannot read (issue 48, item 3):
    a prompt or psi edit for an agent whose ``reads`` lacks ``system_prompt`` or ``psi``
    would be judged on noise, since the agent behaves exactly as without it.

    Args:
        edits: the proposal's edits.
        reads: the components of :data:`AGENT_COMPONENTS` the agent reads.
        agent: the agent as the message names it (e.g. ``"policy agent (sft-webshop)"``).

    Raises:
        EditError: names the edit, its component and the agent, and the kinds it can use.
    """
    for i, e in enumerate(edits, 1):
        comp = EDIT_TARGETS.get(e.kind)
        if comp in AGENT_COMPONENTS and comp not in reads:
            usable = [k for k, c in EDIT_TARGETS.items()
                      if c not in AGENT_COMPONENTS or c in reads]
            raise EditError(f"{where}, edit {i}: a {e.kind!r} edit changes the component "
                            f"{comp!r}, which the {agent} cannot read; refused (edit kinds "
                            f"this agent can use: {usable})")


@dataclass
class Harness:
    """H0 and the edits on it, in order; :attr:`components` is the result."""

    base: dict[str, str] = field(default_factory=lambda: dict(H0_COMPONENTS))
    edits: list[Edit] = field(default_factory=list)

    @property
    def components(self) -> dict[str, str]:
        out = dict(self.base)
        for i, e in enumerate(self.edits):
            out = e.apply(out, where=f"edit {i + 1} ({e.kind})")
        return out

    def extend(self, edits: Sequence[Edit]) -> Harness:
        """A child: this harness plus ``edits`` (checked: raises :class:`EditError`)."""
        child = Harness(dict(self.base), list(self.edits) + list(edits))
        child.components  # noqa: B018 - applies and checks every edit
        return child

    @property
    def id(self) -> str:
        return candidate_id(self.components)

    def as_dict(self) -> dict[str, Any]:
        return {"base": dict(self.base), "edits": [e.as_dict() for e in self.edits]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Harness:
        return cls(dict(d.get("base") or H0_COMPONENTS),
                   [Edit.from_dict(e, f"edit {i + 1}") for i, e in enumerate(d.get("edits", []))])


# ---------------------------------------------------------------------------------------
# the agent inside
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AgentInput:
    """What psi gives the agent for one step."""

    obs: Observation
    system_prompt: str
    history: tuple[str, ...]
    """The last ``psi.history`` actions, oldest first."""
    tree: str | None
    """The UI tree as text (``psi.tree`` on and the environment reads it), else None."""
    slot: int = 0
    """The fleet's phone slot the observation came from (an agent's per-episode memory)."""


class StepAgent(Protocol):
    """The frozen agent a harness wraps.

    ``reads`` (optional): which of :data:`AGENT_COMPONENTS` the agent reads (a prompted
    agent: both; a trained policy: neither). An agent without the attribute is taken to read
    both (:func:`check_readable`)."""

    def propose(self, inputs: Sequence[AgentInput]) -> list[str]:
        """One raw output per input (its action string, maybe malformed)."""

    def retry(self, inputs: Sequence[AgentInput]) -> list[str]:
        """One more try for outputs that did not parse: constrained to the action format
        where the agent can be (a policy's grammar mask), else told the format again."""


class PolicyAgent:
    """A trained :class:`~digirl_lite.policy.Policy` as a harness's agent (frozen: nothing
    here updates it). Its prompt is the policy's own (``Previous Actions: ... Goal: ...``):
    the system prompt and psi (history, tree) are for agents that read text, which a policy
    trained on that prompt does not (``reads`` is empty: DarwinX refuses prompt and psi
    edits for it, :func:`check_readable`). ``retry`` samples again under the action-format
    grammar. ``copy_text``: the policy's copy mask (``copy_typed_text``: a typed text is a span
    of the goal, :mod:`digirl_lite.policy.copying`), on both tries."""

    reads: frozenset[str] = frozenset()

    crn_salt: int | None = None
    """Common random numbers: with a salt, the policy samples each row from its own
    generator seeded by (salt, task, step, try), so two harnesses run on the same tasks with
    the same salt draw the same noise wherever they show the policy the same screen, whatever
    else is in the batch (the runner and the held-out evaluations set it). None: torch's
    global generator."""

    def __init__(self, policy: Any, features: Any, screens: Any, temperature: float = 1.0,
                 max_new_tokens: int = 64, constrained: bool = False,
                 copy_text: bool = False) -> None:
        from digirl_lite.policy.agent import PolicyBatchAgent

        self.policy = policy
        self.free = PolicyBatchAgent(policy, features, screens, temperature, max_new_tokens,
                                     constrained, copy_text=copy_text)
        self.masked = PolicyBatchAgent(policy, features, screens, temperature,
                                       max_new_tokens, True, copy_text=copy_text)

    def _act(self, agent: Any, inputs: Sequence[AgentInput], attempt: int) -> list[str]:
        obs = [i.obs for i in inputs]
        if self.crn_salt is None or agent.temperature <= 0:
            return agent.act_batch(list(range(len(inputs))), obs)
        import hashlib

        seeds = [int.from_bytes(hashlib.sha256(
            f"{self.crn_salt}|{o.task}|{o.step}|{attempt}".encode()).digest()[:8], "little")
            for o in obs]
        inputs_ = (agent.features_of([o.screen_id or screen_id_of_image(o.screenshot)
                                      for o in obs])
                   if self.policy.screen_input == "features" else [o.screenshot for o in obs])
        drawn = self.policy.sample([o.prompt for o in obs], inputs_,
                                   temperature=agent.temperature,
                                   max_new_tokens=agent.max_new_tokens,
                                   constrained=agent.constrained, row_seeds=seeds,
                                   **({"copy_text": agent.copy_text} if agent.copy_text
                                      else {}))
        return [SampledAction(d.text, d.token_ids, d.log_probs) for d in drawn]

    def propose(self, inputs: Sequence[AgentInput]) -> list[str]:
        return self._act(self.free, inputs, 0)

    def retry(self, inputs: Sequence[AgentInput]) -> list[str]:
        return self._act(self.masked, inputs, 1)


class BatchStepAgent:
    """A fleet's batch agent (``act_batch(slots, observations)``: a training run's
    :class:`~digirl_lite.policy.agent.PolicyBatchAgent`) as a harness's agent: each
    step goes to it with its phone's slot, so what it keeps per episode (the texts typed,
    ``typed_span_once``) stays with the right phone, and around an empty harness it acts as
    it does alone. It sees only the steps it decides (a text a rule typed is not in its
    memory). It reads neither prompt nor psi; ``retry`` samples again."""

    reads: frozenset[str] = frozenset()

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def propose(self, inputs: Sequence[AgentInput]) -> list[str]:
        return self.agent.act_batch([i.slot for i in inputs], [i.obs for i in inputs])

    retry = propose


# ---------------------------------------------------------------------------------------
# xi: the action projection
# ---------------------------------------------------------------------------------------
_TYPE_RE = re.compile(r"action_type\W{0,6}(" + "|".join(
    t.value for t in ActionType if t is not ActionType.INVALID) + r")\b")
_POINT_RE = re.compile(r"\[\s*(-?\d*\.?\d+)\s*,\s*(-?\d*\.?\d+)\s*\]")
_TYPED_RE = re.compile(r"typed_text\W{0,6}([^\"]*)\"")


def repair_action(text: str) -> Action | None:
    """An output that does not parse, rebuilt from the fields it does hold: its action type
    and, as that type needs, its first point (a tap there; a second point makes a swipe)
    or its typed text. None when the type is missing or a needed field is."""
    m = _TYPE_RE.search(str(text))
    if m is None:
        return None
    atype = ActionType(m.group(1))
    if atype is ActionType.DUAL_POINT:
        pts = [(float(a), float(b)) for a, b in _POINT_RE.findall(str(text))]
        pts = [p for p in pts if 0.0 <= p[0] <= 1.0 and 0.0 <= p[1] <= 1.0]
        if not pts:
            return None
        (y0, x0), (y1, x1) = pts[0], (pts[1] if len(pts) > 1 else pts[0])
        return Action(ActionType.DUAL_POINT, (y0, x0), (y1, x1), "")
    if atype is ActionType.TYPE:
        t = _TYPED_RE.search(str(text))
        if t is None or not t.group(1).strip():
            return None
        return Action.type_text(t.group(1).strip())
    return Action.key(atype)


def _snap(action: Action, nodes: Sequence[Any], width: int, height: int, max_px: float
          ) -> Action | None:
    """A tap that lands on no clickable node, moved to the centre of the nearest one within
    ``max_px``; None when it already lands on one or none is near."""
    if action.action_type is not ActionType.DUAL_POINT or action.touch_yx != action.lift_yx:
        return None
    y, x = action.touch_yx[0] * height, action.touch_yx[1] * width
    clickable = [n for n in nodes if n.clickable]
    if not clickable:
        return None
    for n in clickable:
        x0, y0, x1, y1 = n.bounds
        if x0 <= x <= x1 and y0 <= y <= y1:
            return None

    def dist(n) -> float:
        x0, y0, x1, y1 = n.bounds
        dx = max(x0 - x, 0.0, x - x1)
        dy = max(y0 - y, 0.0, y - y1)
        return (dx * dx + dy * dy) ** 0.5

    best = min(clickable, key=dist)
    if dist(best) > max_px:
        return None
    cx, cy = best.center
    return Action.tap(x=round(cx / width, 4), y=round(cy / height, 4))


# ---------------------------------------------------------------------------------------
# the harness as a batch agent
# ---------------------------------------------------------------------------------------
@dataclass
class _SlotMemory:
    task: str = ""
    actions: list[str] = field(default_factory=list)
    screens: list[str | None] = field(default_factory=list)
    unparseable: bool = False
    fired: dict[str, set[str]] = field(default_factory=dict)  # screen -> rules acted on it


class HarnessAgent:
    """A harness around a :class:`StepAgent`, behind the fleets' ``act_batch``.

    Per step: the skills first (the first rule whose conditions hold acts, or hands over),
    then the agent on psi's input, then xi on what it wrote. ``decisions`` counts who
    decided each step; each returned string carries it (``decided_by``) onto the step.
    """

    def __init__(self, components: dict[str, str], agent: StepAgent, width: int = 1080,
                 height: int = 2280, where: str = "harness") -> None:
        self.components = dict(components)
        self.psi, self.xi, self.rules = check_components(self.components, where)
        self.agent = agent
        self.width, self.height = width, height
        self.decisions: Counter[str] = Counter()
        self._mem: dict[int, _SlotMemory] = {}

    @property
    def reads(self) -> frozenset[str]:
        """The components of :data:`AGENT_COMPONENTS` the agent inside reads (an agent that
        does not say reads both)."""
        return frozenset(getattr(self.agent, "reads", AGENT_COMPONENTS))

    @property
    def crn_salt(self) -> int | None:
        return getattr(self.agent, "crn_salt", None)

    @crn_salt.setter
    def crn_salt(self, salt: int | None) -> None:
        """Common random numbers for the agent inside (:attr:`PolicyAgent.crn_salt`)."""
        if hasattr(self.agent, "crn_salt"):
            self.agent.crn_salt = salt

    def _memory(self, slot: int, obs: Observation) -> _SlotMemory:
        m = self._mem.get(slot)
        if m is None or obs.step == 0 or m.task != obs.task:
            m = self._mem[slot] = _SlotMemory(task=obs.task)
        return m

    def _context(self, m: _SlotMemory, obs: Observation) -> StepContext:
        sid = obs.screen_id
        no_change = bool(m.screens) and sid is not None and m.screens[-1] == sid
        repeated = (no_change and len(m.actions) >= 2 and m.actions[-1] == m.actions[-2]
                    and len(m.screens) >= 2 and m.screens[-2] == sid)
        return StepContext(goal=obs.task, nodes=obs.ui_tree or (), step=obs.step,
                           last_unparseable=m.unparseable, last_no_change=no_change,
                           last_repeated_no_change=repeated,
                           fired_here=m.fired.get(sid or "", set()))

    def act_batch(self, slots: Sequence[int], observations: Sequence[Observation]) -> list[str]:
        out: list[SampledAction | None] = [None] * len(observations)
        mems = [self._memory(s, o) for s, o in zip(slots, observations)]
        to_agent: list[int] = []
        for i, (m, obs) in enumerate(zip(mems, observations)):
            hit = decide(self.rules, self._context(m, obs), self.width, self.height) \
                if self.rules else None
            if hit is not None and hit[1] is not None:
                rule, text = hit
                m.fired.setdefault(obs.screen_id or "", set()).add(rule.id)
                out[i] = SampledAction(text, decided_by=f"rule:{rule.id}")
            else:
                to_agent.append(i)
        if to_agent:
            inputs = [self._input(mems[i], observations[i], slots[i]) for i in to_agent]
            raw = self.agent.propose(inputs)
            retry: list[int] = []
            for j, i in enumerate(to_agent):
                text, by = self._project(raw[j], observations[i])
                if text is None:
                    retry.append(j)
                    out[i] = _as_sampled(raw[j], "agent")
                else:
                    out[i] = _as_sampled(text, by) if by != "agent" else _as_sampled(raw[j],
                                                                                    "agent")
            if retry:
                again = self.agent.retry([inputs[j] for j in retry])
                for j, text in zip(retry, again):
                    i = to_agent[j]
                    fixed, by = self._project(text, observations[i], allow_retry=False)
                    if fixed is not None:
                        out[i] = _as_sampled(fixed, "xi:retry" if by == "agent" else by)
        for m, obs, a in zip(mems, observations, out):
            self.decisions[a.decided_by.split(":")[0] if a.decided_by.startswith("rule")
                           else a.decided_by] += 1
            m.actions.append(str(a))
            m.screens.append(obs.screen_id)
            m.unparseable = not parse_action(str(a)).is_valid
        return list(out)  # type: ignore[arg-type]

    def _input(self, m: _SlotMemory, obs: Observation, slot: int = 0) -> AgentInput:
        from digirl_lite.envs.uitree import tree_text

        h = int(self.psi["history"])
        tree = (tree_text(obs.ui_tree, int(self.psi["max_nodes"]))
                if self.psi["tree"] and obs.ui_tree is not None else None)
        return AgentInput(obs=obs, system_prompt=self.components["system_prompt"],
                          history=tuple(m.actions[-h:]) if h else (), tree=tree, slot=slot)

    def _project(self, text: str, obs: Observation, allow_retry: bool = True
                 ) -> tuple[str | None, str]:
        """xi on one output: ``(text to send, who decided)``; ``(None, ...)`` when it does
        not parse, cannot be repaired and a retry is due."""
        action = parse_action(str(text))
        by = "agent"
        if not action.is_valid and self.xi["repair"]:
            fixed = repair_action(str(text))
            if fixed is not None:
                action, by = fixed, "xi:repair"
        if not action.is_valid:
            if self.xi["retry"] and allow_retry:
                return None, "agent"
            return str(text), by
        if self.xi["snap"] and obs.ui_tree:
            snapped = _snap(action, obs.ui_tree, self.width, self.height, self.xi["snap_px"])
            if snapped is not None:
                action, by = snapped, "xi:snap"
        return (format_action(action) if by != "agent" else str(text)), by


def _as_sampled(text: Any, by: str) -> SampledAction:
    if isinstance(text, SampledAction) and by == "agent":
        return SampledAction(str(text), text.token_ids, text.log_probs, decided_by=by)
    return SampledAction(str(text), decided_by=by)


def decision_shares(trajectories: Sequence[Any]) -> dict[str, float]:
    """Share of steps decided by the agent, by rules and by xi (``decided_by``)."""
    c: Counter[str] = Counter()
    for t in trajectories:
        for s in t.steps:
            by = s.decided_by or "agent"
            c["rule" if by.startswith("rule:") else "xi" if by.startswith("xi:") else "agent"] += 1
    n = sum(c.values())
    return {k: (c[k] / n if n else 0.0) for k in ("agent", "rule", "xi")}
