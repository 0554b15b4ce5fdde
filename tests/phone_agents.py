"""Scripted agents the tests drive phones with (over the wire or in process)."""

from __future__ import annotations

from digirl_lite.actions import Action, ActionType, format_action


class Tapper:
    """Taps the middle of the screen twice, then says the task is done (every episode 3
    steps, each judged)."""

    def __init__(self, slot: int) -> None:
        del slot

    def act(self, obs) -> str:
        if obs.step >= 2:
            return format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))
        return format_action(Action.tap(x=0.5, y=0.5))
