"""The LLM side of a harness (issue 30, items 2 and 3): a prompted agent and an LLM proposer,
both over the judge's backends (:mod:`digirl_lite.judge.backends`: Gemini, any
OpenAI-compatible server).

- :class:`PromptedAgent`: a frozen vision-language model as a harness's
  :class:`~digirl_lite.harness.harness.StepAgent`. Each step it gets the harness's system
  prompt, the goal, the last actions, the UI tree (as psi chose) and the screenshot, and
  answers with one action line in the AutoUI format. Its reply goes back as text: the
  harness's xi and :func:`~digirl_lite.actions.parse_action` deal with a malformed one.
- :class:`LLMProposer`: the real path of DarwinX's proposer
  (:class:`~digirl_lite.harness.evidence.Proposer`): the current components, the skill rule
  language, the evidence and the shared memory K_g in one prompt, a JSON reply of additive
  edits, each checked by :meth:`~digirl_lite.harness.harness.Edit.apply` before it leaves.

Both retry what a backend marks retryable (rate limits, server errors, timeouts) with
exponential backoff, then give up with one clear exception that names the endpoint and the
error, never the API key (the backends never hold it): :class:`AgentUnavailable` for the
agent (a run cannot act without it), :class:`~digirl_lite.harness.evidence.ProposalError`
for the proposer (the loop records a rejected child and goes on).

A backend is given as an object or as its config dict
(:func:`~digirl_lite.judge.backends.make_backend`)::

    {"backend": "gemini", "model": "gemini-1.5-pro"}                 # key in GEMINI_API_KEY
    {"backend": "openai", "model": "gpt-4o"}                          # key in OPENAI_API_KEY
    {"backend": "openai", "model": "Qwen2-VL-7B-Instruct",
     "base_url": "http://127.0.0.1:8000/v1", "api_key_env": None}     # a local vLLM

This module imports no client library (the backends import theirs on first use) and no
torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import digirl_lite.harness.rules as _rules
from digirl_lite.harness.evidence import Evidence, Memory, ProposalError
from digirl_lite.harness.harness import (
    AGENT_COMPONENTS,
    EDIT_TARGETS,
    PSI_DEFAULT,
    XI_DEFAULT,
    AgentInput,
    Edit,
    EditError,
)
from digirl_lite.judge.backends import Backend, BackendError, make_backend

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["PromptedAgent", "LLMProposer", "AgentUnavailable", "ACTION_FORMAT",
           "agent_prompt_parts", "proposer_prompt", "parse_proposal", "EDIT_KINDS"]

log = logging.getLogger("digirl_lite.harness")

EDIT_KINDS = tuple(EDIT_TARGETS)  # ("skill", "prompt", "xi", "psi")

ACTION_FORMAT = (
    'Answer with exactly one line, in this format:\n'
    'Action Decision: "action_type": "<TYPE>", "touch_point": "[y, x]", '
    '"lift_point": "[y, x]", "typed_text": "<text>"\n'
    '<TYPE> is one of DUAL_POINT (a tap when touch_point equals lift_point, else a swipe '
    'from touch_point to lift_point), TYPE (type typed_text into the focused field), '
    'PRESS_BACK, PRESS_HOME, PRESS_ENTER, STATUS_TASK_COMPLETE (the task is done), '
    'TASK_IMPOSSIBLE. Points are [y, x], y first, each normalised to [0, 1] by the '
    'screen\'s height and width, with four decimals; actions without a point write '
    '"[-1.0, -1.0]". Examples:\n'
    'Action Decision: "action_type": "DUAL_POINT", "touch_point": "[0.3026, 0.1389]", '
    '"lift_point": "[0.3026, 0.1389]", "typed_text": ""\n'
    'Action Decision: "action_type": "TYPE", "touch_point": "[-1.0, -1.0]", '
    '"lift_point": "[-1.0, -1.0]", "typed_text": "usb c cable"\n'
    'Action Decision: "action_type": "PRESS_BACK", "touch_point": "[-1.0, -1.0]", '
    '"lift_point": "[-1.0, -1.0]", "typed_text": ""')
"""The action format as the prompted agent is told it (the AutoUI string of
:mod:`digirl_lite.actions`)."""

RETRY_NOTE = ("Your previous answer did not parse as an action{said}. Answer again with "
              "exactly one action line and nothing else.")


class AgentUnavailable(RuntimeError):
    """The prompted agent's backend failed for good (a non-retryable error such as a bad
    key or a missing model, or retryable errors past the retries). The message names the
    backend (its model and endpoint) and the error; never the API key."""


# ---------------------------------------------------------------------------------------
# shared: backend calls with retries
# ---------------------------------------------------------------------------------------
def _as_backend(backend: Backend | dict[str, Any]) -> Backend:
    return make_backend(backend) if isinstance(backend, dict) else backend


def _describe(backend: Any) -> str:
    """``gemini backend (model 'm' at http://...)``: the model and endpoint, no key."""
    model = getattr(backend, "model", None)
    where = getattr(backend, "base_url", None) or "its default endpoint"
    return (f"{getattr(backend, 'name', type(backend).__name__)} backend "
            f"(model {model!r} at {where})")


def _scrub(message: str, backend: Any) -> str:
    """The key out of a message (the backends scrub theirs already: a second guard)."""
    import os

    env = getattr(backend, "api_key_env", None)
    key = os.environ.get(env) if env else None
    return message.replace(key, "<redacted>") if key else message


class _GaveUp(Exception):
    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class _Caller:
    """One backend request with retries: retryable :class:`BackendError` s are tried again
    up to ``retries`` times after the first attempt, waiting ``backoff_s`` doubled each
    time (capped at ``backoff_max_s``, +-25% jitter); anything else stops at once."""

    def __init__(self, backend: Backend, retries: int, backoff_s: float, backoff_max_s: float,
                 sleep: Callable[[float], None], seed: int | None) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.backend = backend
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.sleep = sleep
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.calls = 0
        self.tokens = 0

    def __call__(self, parts: Sequence[str | Image.Image], who: str) -> str:
        delay, problem = self.backoff_s, ""
        for attempt in range(self.retries + 1):
            if attempt:
                with self._lock:
                    wait = min(delay, self.backoff_max_s) * self._rng.uniform(0.75, 1.25)
                log.warning("%s (%s): %s; try %d of %d in %.1f s", who,
                            _describe(self.backend), problem[:200], attempt + 1,
                            self.retries + 1, wait)
                self.sleep(wait)
                delay *= 2
            with self._lock:
                self.calls += 1
            try:
                reply = self.backend.generate(parts)
            except BackendError as e:
                problem = _scrub(str(e), self.backend)
                if not e.retryable:
                    raise _GaveUp(problem, attempt + 1) from None
                continue
            except (RuntimeError, ImportError) as e:  # no key set, no client library
                raise _GaveUp(_scrub(str(e), self.backend), attempt + 1) from None
            with self._lock:
                self.tokens += reply.tokens or 0
            return reply.text or ""
        raise _GaveUp(problem, self.retries + 1)


# ---------------------------------------------------------------------------------------
# the prompted agent
# ---------------------------------------------------------------------------------------
def _shrink(img: Image.Image, width: int | None) -> Image.Image:
    from digirl_lite.judge.guards import shrink

    return shrink(img, width)


def agent_prompt_parts(inp: AgentInput, image_width: int | None = 540,
                       retry_of: str | None = None) -> list[str | Image.Image]:
    """The request for one step: the system prompt, the goal, the last actions, the UI
    tree (when psi gives it), the screenshot shrunk to ``image_width`` (aspect kept) and
    the answer format; ``retry_of``: the previous answer, which did not parse (the request
    says so and restates the format)."""
    shot = inp.obs.screenshot
    w, h = shot.size
    parts: list[str | Image.Image] = [inp.system_prompt.strip(), f"Goal: {inp.obs.task}"]
    if inp.history:
        parts.append("Previous actions (oldest first):\n" + "\n".join(inp.history))
    else:
        parts.append("Previous actions: none (this is the first step).")
    if inp.tree is not None:
        parts.append(f"UI elements on the screen ([id] class \"text\" (x0,y0,x1,y1) in pixels "
                     f"of the {w} x {h} screen):\n{inp.tree or '(none)'}")
    parts += [f"Screenshot ({w} x {h} screen):", _shrink(shot, image_width)]
    if retry_of is not None:
        said = f" (you wrote: {retry_of.strip()[:300]!r})" if retry_of.strip() else ""
        parts.append(RETRY_NOTE.format(said=said))
    parts.append(ACTION_FORMAT)
    return parts


class PromptedAgent:
    """A vision-language model behind a judge backend, as a harness's agent (frozen).

    ``propose(inputs)`` makes one request per input (:func:`agent_prompt_parts`) and returns
    the replies as they are: a malformed reply is text for the harness's xi and the
    environment's parser (an invalid action costs a step), never an exception here.
    ``retry(inputs)`` asks once more, saying the previous answer did not parse and
    restating the format.

    Args:
        backend: a :class:`~digirl_lite.judge.backends.Backend` or its config dict.
        retries: retryable backend errors are tried again up to this many times per request
            (so ``retries + 1`` attempts), with exponential backoff.
        backoff_s, backoff_max_s: first wait between attempts, doubled each time, capped;
            +-25% jitter.
        image_width: the screenshot is shrunk to this width, aspect kept (540: half a
            1080-wide screen; None sends it whole).
        workers: requests of one batch in flight at once. 1 (default): sequential, the
            simple and rate-limit friendly choice; more uses a thread pool of that size
            (the backends' clients are thread-safe).
        sleep: how to wait (tests pass a recorder). seed: seeds the jitter.

    Raises (from ``propose`` / ``retry``):
        AgentUnavailable: the backend failed for good; names the backend and the error.
    """

    reads = frozenset(AGENT_COMPONENTS)
    """It reads the system prompt and psi's context (:func:`agent_prompt_parts`)."""

    def __init__(self, backend: Backend | dict[str, Any], retries: int = 3,
                 backoff_s: float = 2.0, backoff_max_s: float = 30.0,
                 image_width: int | None = 540, workers: int = 1,
                 sleep: Callable[[float], None] = time.sleep, seed: int | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.backend = _as_backend(backend)
        self.image_width = image_width
        self.workers = workers
        self._call = _Caller(self.backend, retries, backoff_s, backoff_max_s, sleep, seed)
        self._last: dict[int, str] = {}  # id(input) -> its reply, for retry()

    def __repr__(self) -> str:
        return f"PromptedAgent({self.backend!r})"

    @property
    def calls(self) -> int:
        """Requests made so far (retried attempts included)."""
        return self._call.calls

    @property
    def tokens(self) -> int:
        """Tokens the backends reported so far."""
        return self._call.tokens

    def config(self) -> dict[str, Any]:
        """Everything needed to rebuild this agent, without secrets."""
        return {"backend": self.backend.config(), "retries": self._call.retries,
                "backoff_s": self._call.backoff_s, "image_width": self.image_width,
                "workers": self.workers}

    def _ask(self, parts: list[str | Image.Image]) -> str:
        try:
            return self._call(parts, "prompted agent")
        except _GaveUp as e:
            raise AgentUnavailable(f"prompted agent: the {_describe(self.backend)} failed "
                                   f"after {e.attempts} attempt(s): {e}") from None

    def _run(self, requests: list[list[str | Image.Image]]) -> list[str]:
        if self.workers == 1 or len(requests) <= 1:
            return [self._ask(p) for p in requests]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(self.workers, len(requests))) as pool:
            return list(pool.map(self._ask, requests))

    def propose(self, inputs: Sequence[AgentInput]) -> list[str]:
        out = self._run([agent_prompt_parts(i, self.image_width) for i in inputs])
        self._last = {id(i): text for i, text in zip(inputs, out)}
        return out

    def retry(self, inputs: Sequence[AgentInput]) -> list[str]:
        return self._run([agent_prompt_parts(i, self.image_width,
                                             retry_of=self._last.get(id(i), ""))
                          for i in inputs])


# ---------------------------------------------------------------------------------------
# the LLM proposer
# ---------------------------------------------------------------------------------------
_KIND_HELP = {
    "skill": '- "skill": rule lines to append to the skills (one JSON object per line, in the '
             "rule language below; ids must be new).",
    "prompt": '- "prompt": a paragraph appended to the system prompt.',
    "xi": f'- "xi": a JSON object of action-projection settings to change, keys '
          f"{list(XI_DEFAULT)} (repair, retry and snap can only be switched on).",
    "psi": f'- "psi": a JSON object of context settings to change, keys {list(PSI_DEFAULT)} '
           "(history 0-20 actions, tree true/false, max_nodes 1-500).",
}
_REPLY_FORMAT = (
    'Reply with one JSON object and nothing else:\n'
    '{{"edits": [{{"kind": {kinds}, "content": "...", '
    '"rationale": "which evidence this answers and why it should help"}}]}}')


def _evidence_text(evidence: Sequence[Evidence], limit: int) -> str:
    """The evidence as JSON, trimmed to about ``limit`` characters: trees cut (the tree of
    the step where it went wrong kept longest), then whole items left out (counted)."""
    items: list[str] = []
    used = 0
    for n, e in enumerate(evidence):
        d = e.as_dict()
        at = e.at if e.at >= 0 else len(e.steps) + e.at
        for key in ("steps", "contrast"):
            for i, s in enumerate(d[key]):
                keep = 1500 if key == "steps" and i == at else 300
                if len(s["tree"]) > keep:
                    s["tree"] = s["tree"][:keep] + " ...(trimmed)"
        text = json.dumps(d, ensure_ascii=False)
        if used + len(text) > limit:
            shown = n
            if not items:  # the first item alone is too long: cut it
                items.append(text[:limit] + " ...(trimmed)")
                shown = 1
            if len(evidence) > shown:
                items.append(f"({len(evidence) - shown} more evidence item(s) left out for "
                             "length)")
            break
        items.append(text)
        used += len(text)
    return "\n".join(items) if items else "(none)"


def _memory_text(memory: Memory) -> str:
    def short(ds: Sequence[dict[str, Any]]) -> str:
        return "\n".join(json.dumps(d, ensure_ascii=False)[:600] for d in ds) or "(none)"

    themes = ", ".join(f"{k}: {v}" for k, v in memory.themes.most_common()) or "(none)"
    return (f"Failure themes so far (counts): {themes}\n"
            "Edits that worked (kept already: do not propose them again):\n"
            f"{short(memory.worked)}\n"
            f"Edits that regressed (do not propose these or close variants):\n"
            f"{short(memory.regressed)}")


def proposer_prompt(components: dict[str, str], evidence: Sequence[Evidence], memory: Memory,
                    max_edits: int = 3, evidence_chars: int = 12000,
                    kinds: Sequence[str] = EDIT_KINDS) -> str:
    """The proposer's prompt: the task, the current components, the edit kinds, the rule
    language (the reference in :mod:`digirl_lite.harness.rules`' docstring), the evidence
    (trimmed to ``evidence_chars``), the memory K_g and the reply format. ``kinds``: the
    edit kinds offered (an agent that cannot read the system prompt or psi is offered
    neither, and the components it cannot read are not shown); with all of them the prompt
    is the one earlier runs cached."""
    offered = [k for k in EDIT_KINDS if k in kinds]
    shown = {EDIT_TARGETS[k] for k in offered} | (set(components) - set(EDIT_TARGETS.values()))
    comps = "\n\n".join(f"### {k}\n{v if v.strip() else '(empty)'}"
                        for k, v in components.items() if k in shown)
    help_ = "\n".join(_KIND_HELP[k] for k in offered)
    left = [k for k in EDIT_KINDS if k not in offered]
    if left:
        help_ += (f"\nNo other kind: the agent cannot read what {left} edits change "
                  f"({[EDIT_TARGETS[k] for k in left]}); such edits are refused.")
    return "\n\n".join([
        "You improve the harness around a frozen agent that operates an Android phone (its "
        "weights never change). The harness is a set of text components; you propose "
        f"at most {max_edits} additive edits that fix the failures in the evidence without "
        "breaking what the agent already solves. Edits only add behaviour: a rule appended, "
        "a prompt paragraph appended, a setting switched on.",
        "## Current components\n" + comps,
        "## Edit kinds\n" + help_,
        "## The skill rule language\n" + (_rules.__doc__ or "").strip(),
        "## Evidence (failure-derived, teacher-derived, self-derived)\n"
        + _evidence_text(evidence, evidence_chars),
        "## Shared memory\n" + _memory_text(memory),
        "## Reply\n" + _REPLY_FORMAT.format(kinds=" | ".join(f'"{k}"' for k in offered)),
    ])


_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.S)


def _find_json(text: str) -> Any:
    """The JSON value in a reply: the whole text, a fenced block, or the first object
    (or list) in surrounding prose. Raises ValueError when there is none."""
    t = text.strip()
    try:
        return json.loads(t)
    except json.JSONDecodeError:
        pass
    for m in _FENCE.finditer(text):
        try:
            return json.loads(m.group(1).strip())
        except json.JSONDecodeError:
            continue
    dec = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "{[":
            try:
                value, _ = dec.raw_decode(text, i)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict) or (isinstance(value, list) and value
                                           and isinstance(value[0], dict)):
                return value
    raise ValueError("no JSON object found")


def _content_text(kind: str, content: Any) -> Any:
    """Lenient on shape, strict on meaning: a settings object or rule objects given as
    JSON values (not strings) are written as the text they stand for."""
    if isinstance(content, dict) and kind in ("xi", "psi"):
        return json.dumps(content)
    if kind == "skill" and isinstance(content, dict):
        return json.dumps(content)
    if kind == "skill" and isinstance(content, list) and all(isinstance(r, dict)
                                                             for r in content):
        return "\n".join(json.dumps(r) for r in content)
    return content


def parse_proposal(reply: str, components: dict[str, str], provenance: dict[str, Any],
                   max_edits: int = 3, tried: set[str] | frozenset[str] = frozenset()
                   ) -> list[Edit]:
    """The edits of a proposer's reply, each applied (in order) to ``components`` to check
    it. Edits whose content ``tried`` holds (judged before) are dropped; past ``max_edits``
    the rest are dropped.

    Raises:
        ProposalError: not JSON, no edits, an unknown kind, an edit that does not apply
            (:class:`EditError`'s message: for a rule, its line), or only edits tried before;
            the message quotes the start of the reply.
    """
    quote = f"reply starts {reply.strip()[:300]!r}"
    try:
        value = _find_json(reply)
    except ValueError:
        raise ProposalError(f"LLM proposal is not JSON ({quote})") from None
    raw = value.get("edits") if isinstance(value, dict) else value
    if not isinstance(raw, list) or not raw:
        raise ProposalError(f"LLM proposal has no edits (want {{\"edits\": [...]}}; {quote})")
    edits: list[Edit] = []
    cur = dict(components)
    skipped = 0
    for i, d in enumerate(raw, 1):
        if len(edits) == max_edits:
            break
        where = f"LLM proposal, edit {i}"
        if not isinstance(d, dict):
            raise ProposalError(f"{where}: not an object ({quote})")
        kind = d.get("kind")
        if kind not in EDIT_KINDS:
            raise ProposalError(f"{where}: unknown kind {kind!r}; use {list(EDIT_KINDS)} "
                                f"({quote})")
        content = _content_text(kind, d.get("content"))
        if not isinstance(content, str) or not content.strip():
            raise ProposalError(f"{where} ({kind}): content must be non-empty text ({quote})")
        if content.strip() in tried or content in tried:
            skipped += 1
            continue
        rationale = d.get("rationale")
        edit = Edit(kind, content, {**provenance, "rationale": str(rationale)[:1000]
                                    if rationale is not None else ""})
        try:
            cur = edit.apply(cur, where=where)
        except EditError as e:
            raise ProposalError(f"{e} ({quote})") from None
        edits.append(edit)
    if not edits:
        raise ProposalError(f"LLM proposal: all {skipped} edit(s) were tried before (memory "
                            f"K_g: worked or regressed) ({quote})")
    return edits


class LLMProposer:
    """DarwinX's proposer over a language model (the real path; ``name = "llm"``).

    ``propose(components, evidence, memory)`` sends one prompt (:func:`proposer_prompt`:
    the components, the rule language, the evidence trimmed to ``evidence_chars``, the
    memory K_g) and turns the JSON reply into :class:`Edit` s with their provenance
    (``{"proposer": "llm", "model", "evidence": [kinds], "rationale"}``), each checked by
    :meth:`Edit.apply`. Every failure is a
    :class:`~digirl_lite.harness.evidence.ProposalError` that the loop records as a rejected
    child before going on: a reply that is not JSON, has no edits or holds an edit that does
    not apply (quoting the reply and saying why), and a backend that still fails after
    ``retries`` (naming the backend and the error, never the key).

    Args:
        backend: a :class:`~digirl_lite.judge.backends.Backend` or its config dict. Give an
            OpenAI-compatible backend ``max_tokens`` room for the reply (2048, say).
        max_edits: edits kept per proposal (the rest of a longer reply are dropped).
        retries, backoff_s, backoff_max_s, sleep, seed: as :class:`PromptedAgent`.
        evidence_chars: size limit of the evidence in the prompt.
        kinds: the edit kinds the prompt offers (default all of :data:`EDIT_KINDS`); an agent
            that cannot read the system prompt or psi (a trained policy) is offered
            ``("skill", "xi")``. A reply may still hold another kind: the loop refuses what
            the agent cannot read (:func:`~digirl_lite.harness.harness.check_readable`).
        cache_path: a JSONL file of ``{"key", "reply"}`` lines (key: a hash of the backend's
            model and the prompt). The n-th request of a prompt in this process is answered
            by the n-th cached reply for it when there is one, so a resumed evolution run
            replays the same proposals without calling the API again; new replies are
            appended (flushed) as they arrive. A torn last line (``kill -9`` mid-write) is
            skipped.
    """

    name = "llm"

    def __init__(self, backend: Backend | dict[str, Any], max_edits: int = 3,
                 retries: int = 3, backoff_s: float = 2.0, backoff_max_s: float = 30.0,
                 evidence_chars: int = 12000, cache_path: str | Path | None = None,
                 sleep: Callable[[float], None] = time.sleep, seed: int | None = None,
                 kinds: Sequence[str] = EDIT_KINDS) -> None:
        if max_edits < 1:
            raise ValueError(f"max_edits must be >= 1, got {max_edits}")
        bad = [k for k in kinds if k not in EDIT_KINDS]
        if bad or not kinds:
            raise ValueError(f"kinds must be some of {list(EDIT_KINDS)}, got {list(kinds)}")
        self.kinds = tuple(k for k in EDIT_KINDS if k in kinds)
        self.backend = _as_backend(backend)
        self.max_edits = max_edits
        self.evidence_chars = evidence_chars
        self._call = _Caller(self.backend, retries, backoff_s, backoff_max_s, sleep, seed)
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self._cache: dict[str, list[str]] = self._load_cache()
        self._asked: Counter[str] = Counter()
        self.cache_hits = 0
        self.last_reply: str | None = None

    def __repr__(self) -> str:
        return f"LLMProposer({self.backend!r})"

    @property
    def calls(self) -> int:
        """Requests made so far (cache hits are none)."""
        return self._call.calls

    def config(self) -> dict[str, Any]:
        return {"proposer": self.name, "backend": self.backend.config(),
                "max_edits": self.max_edits, "retries": self._call.retries,
                "evidence_chars": self.evidence_chars, "kinds": list(self.kinds),
                "cache_path": str(self.cache_path) if self.cache_path else None}

    # -- cache ----------------------------------------------------------------------------
    def _load_cache(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        if self.cache_path is None or not self.cache_path.is_file():
            return out
        for n, line in enumerate(self.cache_path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                out.setdefault(str(d["key"]), []).append(str(d["reply"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                log.warning("%s line %d: not a cache entry, skipped", self.cache_path, n)
        return out

    def _key(self, prompt: str) -> str:
        who = json.dumps([getattr(self.backend, "name", ""), getattr(self.backend, "model", "")])
        return hashlib.sha256((who + "\n" + prompt).encode()).hexdigest()

    def _store(self, key: str, reply: str) -> None:
        self._cache.setdefault(key, []).append(reply)
        if self.cache_path is None:
            return
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.cache_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"key": key, "reply": reply}, ensure_ascii=False) + "\n")
            f.flush()

    # -- proposing ------------------------------------------------------------------------
    def ask(self, prompt: str) -> str:
        """The reply to ``prompt``: from the cache when it holds the n-th reply for the n-th
        request, else from the backend (with retries; then cached).

        Raises:
            ProposalError: the backend failed for good.
        """
        key = self._key(prompt)
        n = self._asked[key]
        self._asked[key] += 1
        cached = self._cache.get(key, [])
        if n < len(cached):
            self.cache_hits += 1
            return cached[n]
        try:
            reply = self._call([prompt], "LLM proposer")
        except _GaveUp as e:
            raise ProposalError(f"LLM proposer: the {_describe(self.backend)} failed after "
                                f"{e.attempts} attempt(s): {e}") from None
        self._store(key, reply)
        return reply

    def propose(self, components: dict[str, str], evidence: Sequence[Evidence],
                memory: Memory) -> list[Edit]:
        """Edits for a child of the harness with ``components`` (module docstring).

        Raises:
            ProposalError: the reply is not a valid edit, or the backend failed for good;
                the loop records a rejected child and goes on.
        """
        prompt = proposer_prompt(components, evidence, memory, self.max_edits,
                                 self.evidence_chars, self.kinds)
        reply = self.ask(prompt)
        self.last_reply = reply
        kinds = sorted({e.kind for e in evidence})
        prov = {"proposer": self.name, "model": getattr(self.backend, "model", None),
                "evidence": kinds}
        return parse_proposal(reply, components, prov, self.max_edits, memory.tried())
