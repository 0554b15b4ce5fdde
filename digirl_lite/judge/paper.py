"""The paper's evaluator (spec/DIGIRL.md section 4): few-shot VLM judge with guards.

The VLM sees labelled examples (screenshot, task, the three-line answer), then the task and
the current screenshot shrunk 4x per side, and must answer::

    Q: What should I expect to see on the screenshot if I've <repeat the task>?
    A: I should expect to see <first expectation, then what's in the given screenshot.>
    Status: success or failure (don't return anything else)

The verdict is read with ``Status:\\s*(\\w+)``. API failures are retried with exponential
backoff (5 attempts); a reply without a readable status is retried too; when every attempt
fails the step is UNJUDGED, never a silent failure.
"""

from __future__ import annotations

import csv
import json
import logging
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from digirl_lite.data.records import Verdict
from digirl_lite.judge.backends import Backend, BackendError
from digirl_lite.judge.base import JudgeResult
from digirl_lite.judge.guards import MSE_THRESHOLD, ScreenGuards, shrink

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["STATUS_RE", "parse_status", "FewShotExample", "FewShotSet", "PaperJudge",
           "build_prompt_parts", "expected_q"]

STATUS_RE = re.compile(r"Status:\s*(\w+)")
log = logging.getLogger("digirl_lite.judge")

INTRO = ("You're an expert in evaluating whether the Screenshot successfully completes the "
         "Task.")
FORMAT = (
    "Respond in this format:\n"
    "Q: What should I expect to see on the screenshot if I've <repeat the task>?\n"
    "A: I should expect to see <first expectation, then what's in the given screenshot.>\n"
    "Status: success or failure (don't return anything else)\n"
    'Start your response with "Q:".'
)


def parse_status(reply: str | None) -> str | None:
    """``"success"`` or ``"failure"`` from the first ``Status:`` line, else None."""
    if not reply:
        return None
    m = STATUS_RE.search(reply)
    if m is None:
        return None
    word = m.group(1).lower()
    return word if word in ("success", "failure") else None


_PAST = (("go to ", "gone to "), ("search for ", "searched for "), ("select ", "selected "),
         ("open ", "opened "), ("launch ", "launched "), ("google ", "googled "),
         ("find ", "found "), ("show me ", "been shown "), ("look up ", "looked up "),
         ("click ", "clicked "), ("play ", "played "), ("check ", "checked "))
_QUESTION = ("what", "how", "where", "who", "when", "which", "why", "is ", "are ", "can ",
             "do ", "does ", "tell me")


def expected_q(task: str) -> str:
    """The Q line for ``task``, the task retold as done ("if I've gone to costco.com, ...")."""
    t = task.strip().rstrip("?.")
    low = t.lower()
    if low.startswith(_QUESTION):
        done = f"searched for '{t}'"
    else:
        done = t
        for verb, past in _PAST:
            done = re.sub(rf"(^|, |and ){re.escape(verb)}", lambda m, p=past: m.group(1) + p,
                          done, flags=re.IGNORECASE)
    return f"Q: What should I expect to see on the screenshot if I've {done}?"



@dataclass(frozen=True)
class FewShotExample:
    """One labelled screenshot: the task, the full answer (Q/A/Status lines), the image."""

    image_path: Path
    task: str
    answer: str

    @property
    def status(self) -> str | None:
        return parse_status(self.answer)

    def image(self) -> Image.Image:
        from PIL import Image

        with Image.open(self.image_path) as im:
            return im.convert("RGB")


class FewShotSet:
    """Few-shot examples as data: a folder of images plus ``labels.jsonl`` (or
    ``labels.csv``) with the fields ``image``, ``task``, ``answer``.

    The simulator ships its own set in ``digirl_lite/assets/judge_examples/`` (found with
    :func:`~digirl_lite.paths.data_dir`); users bring the AitW sets (9 General, 11 Web
    Shopping examples in the paper) in the same layout.
    """

    def __init__(self, examples: Sequence[FewShotExample]) -> None:
        self.examples = list(examples)
        for e in self.examples:
            if e.status is None:
                raise ValueError(f"few-shot example {e.image_path.name}: its answer has no "
                                 "'Status: success|failure' line")
        self._images: list[Image.Image] | None = None

    def __len__(self) -> int:
        return len(self.examples)

    @classmethod
    def load(cls, folder: str | Path) -> FewShotSet:
        folder = Path(folder)
        rows: list[dict[str, str]]
        if (folder / "labels.jsonl").is_file():
            lines = (folder / "labels.jsonl").read_text(encoding="utf-8").splitlines()
            try:
                rows = [json.loads(x) for x in lines if x.strip()]
            except json.JSONDecodeError as e:
                raise ValueError(f"{folder / 'labels.jsonl'}: {e}") from e
        elif (folder / "labels.csv").is_file():
            with open(folder / "labels.csv", newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
        else:
            raise FileNotFoundError(f"{folder} has no labels.jsonl or labels.csv")
        out = []
        for i, r in enumerate(rows, 1):
            missing = [k for k in ("image", "task", "answer") if not r.get(k)]
            if missing:
                raise ValueError(f"{folder} label row {i}: missing {missing}")
            path = folder / r["image"]
            if not path.is_file():
                raise FileNotFoundError(f"{folder} label row {i}: no image {path.name}")
            out.append(FewShotExample(path, r["task"], r["answer"]))
        return cls(out)

    def images(self) -> list[Image.Image]:
        if self._images is None:
            self._images = [e.image() for e in self.examples]
        return self._images


def build_prompt_parts(task: str, screenshot: Image.Image,
                       examples: FewShotSet | None) -> list[str | Image.Image]:
    """The multimodal prompt: intro, the labelled examples, then this task and screenshot."""
    parts: list[str | Image.Image] = [INTRO + "\n" + FORMAT]
    if examples is not None and len(examples):
        parts.append("=====Examples=====")
        for ex, img in zip(examples.examples, examples.images()):
            parts += ["Screenshot:", img, f"Task: {ex.task}\n{ex.answer.strip()}"]
    parts += ["=====Your Turn=====", "Screenshot:", screenshot,
              f"Task: {task}\n{FORMAT}"]
    return parts


class PaperJudge:
    """The paper's few-shot VLM evaluator behind the two guards of one device.

    Args:
        backend: a :class:`~digirl_lite.judge.backends.Backend` (Gemini, OpenAI-compatible).
        examples: the few-shot set (None: zero-shot).
        max_attempts: tries per verdict, API failures and unreadable replies alike (5).
        backoff_s: first wait between tries; doubled each time, capped at ``backoff_max_s``,
            with +-25% jitter.
        judge_width: the screenshot is shrunk to this width (270: 1080 -> 270, the
            reference's 4x per side).
        guards: use the change and seen-recently guards (on by default).
        threshold, recent: the guards' settings (65.025, 5).
        sleep: how to wait (tests pass a recorder).
        seed: seeds the jitter.
    """

    def __init__(
        self, backend: Backend, examples: FewShotSet | None = None, *, max_attempts: int = 5,
        backoff_s: float = 2.0, backoff_max_s: float = 60.0, judge_width: int | None = 270,
        guards: bool = True, threshold: float = MSE_THRESHOLD, recent: int = 5,
        sleep: Callable[[float], None] = time.sleep, seed: int | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.backend = backend
        self.examples = examples
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.judge_width = judge_width
        self.guards = ScreenGuards(threshold, recent) if guards else None
        self.sleep = sleep
        self._rng = random.Random(seed)
        self.calls = 0
        self.unjudged = 0

    def config(self) -> dict[str, Any]:
        """Everything needed to rebuild this judge, without secrets."""
        return {"judge": "paper", "backend": self.backend.config(),
                "examples": [str(e.image_path) for e in self.examples.examples]
                if self.examples else None,
                "max_attempts": self.max_attempts, "backoff_s": self.backoff_s,
                "judge_width": self.judge_width, "guards": self.guards is not None}

    def reset(self) -> None:
        """A new episode on this device (remembered screens stay: they are keyed by task)."""

    def judge(self, task, prev, cur, *, history=None, state=None) -> JudgeResult:
        t0 = time.perf_counter()
        task_text = getattr(task, "text", task)
        if self.guards is not None:
            hit = self.guards.check(task_text, prev, cur)
            if hit is not None:
                verdict, reason, reply = hit
                return JudgeResult(verdict, reply=reply, skipped=reason,
                                   latency_s=time.perf_counter() - t0)
        parts = build_prompt_parts(task_text, shrink(cur, self.judge_width), self.examples)
        calls, tokens, last_problem, reply_text = 0, 0, "", None
        delay = self.backoff_s
        for attempt in range(self.max_attempts):
            if attempt:
                wait = min(delay, self.backoff_max_s) * self._rng.uniform(0.75, 1.25)
                log.warning("judge (%s): %s; try %d of %d in %.1f s", self.backend,
                            last_problem[:200], attempt + 1, self.max_attempts, wait)
                self.sleep(wait)
                delay *= 2
            calls += 1
            try:
                reply = self.backend.generate(parts)
            except BackendError as e:  # only API errors (and unreadable replies) are retried
                last_problem = str(e)
                if not e.retryable:
                    break
                continue
            tokens += reply.tokens or 0
            reply_text = reply.text
            status = parse_status(reply.text)
            if status is not None:
                self.calls += calls
                verdict = Verdict(status)
                if self.guards is not None:
                    self.guards.remember(task_text, cur, verdict, reply.text)
                return JudgeResult(verdict, reply=reply.text, calls=calls,
                                   tokens=tokens or None, latency_s=time.perf_counter() - t0)
            last_problem = "reply has no 'Status: success|failure' line"
        self.calls += calls
        self.unjudged += 1
        return JudgeResult(Verdict.UNJUDGED, reply=reply_text,
                           skipped=f"unjudged after {calls} attempt(s): {last_problem}",
                           calls=calls, tokens=tokens or None,
                           latency_s=time.perf_counter() - t0)
