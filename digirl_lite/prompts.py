"""The policy prompt (spec/DIGIRL.md section 3): only the single last action is kept."""

from __future__ import annotations

import re

__all__ = ["build_prompt", "task_from_prompt"]

_GOAL_RE = re.compile(r"Goal:\s*(?P<task>.*?)\s*(?:</s>)?\s*$", re.DOTALL)


def build_prompt(task: str, last_action_text: str | None = None) -> str:
    """``Previous Actions: <last action string> Goal: <task></s>``.

    On the first step there is no previous action: ``Previous Actions: Goal: <task></s>``.
    """
    last = (last_action_text or "").strip()
    prev = f"Previous Actions: {last} " if last else "Previous Actions: "
    return f"{prev}Goal: {task}</s>"


def task_from_prompt(prompt: str) -> str | None:
    """The task of a prompt written by :func:`build_prompt` (or the released code), or None."""
    idx = prompt.rfind("Goal:")
    if idx < 0:
        return None
    m = _GOAL_RE.match(prompt[idx:])
    return m["task"] if m else None
