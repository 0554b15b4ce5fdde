"""A policy as a fleet's batch agent (``act_batch(slots, observations)``): what every
collection of a training run samples through, and what a harness wraps around a trained
policy (:class:`~digirl_lite.harness.harness.PolicyAgent`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from digirl_lite.data.records import ScreenTable, screen_id_of_image
from digirl_lite.envs.base import Observation
from digirl_lite.rollout.episode import SampledAction

__all__ = ["PolicyBatchAgent"]


class PolicyBatchAgent:
    """The policy behind the fleet's batch interface: features by screen content (cached),
    one sampling call for every phone of the batch.

    ``copy_once`` (with ``copy_text``; ``typed_span_once``): the agent keeps, per phone slot,
    the texts its episode has typed (from the actions it sampled; a new episode starts where
    an observation's ``step`` is 0 or its task changes), and the copy mask does not type one
    again while another span is left (:mod:`digirl_lite.policy.copying`)."""

    def __init__(self, policy, features, screens: ScreenTable, temperature: float = 1.0,
                 max_new_tokens: int = 64, constrained: bool = False,
                 copy_text: Any = False, copy_once: bool = False) -> None:
        if copy_once and not copy_text:
            raise ValueError("copy_once needs copy_text (the copy mask applies it)")
        self.policy, self.features, self.screens = policy, features, screens
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.constrained, self.copy_text = constrained, copy_text
        self.copy_once = bool(copy_once)
        # slot -> (task, last step seen, texts typed)
        self._typed: dict[Any, tuple[str, int, list[str]]] = {}
        self.seconds = 0.0  # time spent in act_batch (features + sampling): "inference"
        self.calls = 0

    def typed_before(self, slots: Sequence[Any],
                     observations: Sequence[Observation]) -> list[list[str]]:
        """Each slot's texts typed so far in its current episode (reset at a new one: step
        0, a step before the last one seen on the slot, or another task; so also where a
        harness around the agent decided the new episode's first steps)."""
        out = []
        for slot, o in zip(slots, observations):
            task, last, texts = self._typed.get(slot, (None, -1, []))
            if o.step == 0 or o.step < last or task != o.task:
                texts = []
            self._typed[slot] = (o.task, o.step, texts)
            out.append(list(texts))
        return out

    def _record_typed(self, slots: Sequence[Any], texts: Sequence[str]) -> None:
        from digirl_lite.actions import ActionType, parse_action

        for slot, text in zip(slots, texts):
            a = parse_action(text)
            if a.action_type == ActionType.TYPE and slot in self._typed:
                self._typed[slot][2].append(a.typed_text)

    def features_of(self, screen_ids: Sequence[str]) -> np.ndarray:
        # a screen whose features are cached is not read again (it may be on disk by now)
        imgs = [None if i in self.features else self.screens.image(i) for i in screen_ids]
        f = self.features.get(imgs, list(screen_ids))
        for sid, row in zip(screen_ids, f):
            if not self.screens.has_features(sid):
                self.screens.add(features=row, screen_id=sid)
        return f

    def act_batch(self, slots, observations: Sequence[Observation]) -> list[str]:
        t0 = time.perf_counter()
        if self.policy.screen_input == "images":  # a VLM reads the screenshot itself
            inputs = [o.screenshot for o in observations]
        else:
            inputs = self.features_of([o.screen_id or screen_id_of_image(o.screenshot)
                                       for o in observations])
        kw: dict[str, Any] = {"copy_text": self.copy_text} if self.copy_text else {}
        if self.copy_once:
            kw["typed"] = self.typed_before(slots, observations)
        drawn = self.policy.sample([o.prompt for o in observations], inputs,
                                   temperature=self.temperature,
                                   max_new_tokens=self.max_new_tokens,
                                   constrained=self.constrained, **kw)
        if self.copy_once:
            self._record_typed(slots, [d.text for d in drawn])
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        # strings that carry their tokens and log-probabilities onto the steps (issue 17)
        return [SampledAction(d.text, d.token_ids, d.log_probs) for d in drawn]
