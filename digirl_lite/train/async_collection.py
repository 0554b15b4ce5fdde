"""The asynchronous learner's background collection (``learner="async"``; issue 17,
spec/DARWIN.md A.1): the fleet runs on an endless stream of training tasks with a copy of the
policy of its own, each online iteration takes the oldest completed trajectories
(:meth:`AsyncCollection.take_online`), drops the stale ones, and publishes the new weights to
the phones after its update (:meth:`AsyncCollection._publish`).

A mixin of :class:`~digirl_lite.train.trainer.Trainer` (its state is set in the Trainer's
``__init__``: ``_collecting``, ``_behaviour``, ``_collect_screens``, ``_collect_agent``,
``_carried``, ``_generation``).
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from digirl_lite.data.records import ScreenTable, Source, Trajectory
from digirl_lite.policy.agent import PolicyBatchAgent
from digirl_lite.rollout.fleet import JudgeUnavailable, NoDevicesLeft

__all__ = ["AsyncCollection"]


class AsyncCollection:
    """The background collection (mixed into :class:`~digirl_lite.train.trainer.Trainer`)."""

    def take_online(self, k: int) -> tuple[list[Trajectory], dict[str, Any]]:
        """Iteration ``k``'s data from the background collection (started here if it is not
        running): completed trajectories in ``take_order``, first those carried over from a
        stopped collection, until ``rollouts_per_iteration`` of them are at most
        ``max_staleness`` policy versions behind the learner's (``k - 1``: the weights after
        ``k - 1`` iterations). A trajectory's staleness is that of its oldest step; staler
        ones are dropped (neither stored nor trained on, counted in ``async_dropped``).
        What is kept is renumbered to iteration ``k``, its screens copied into the run's
        table, and stored. Returns the trajectories and the counts for metrics.jsonl:
        ``async_dropped``, ``staleness`` (kept trajectories per staleness) and
        ``staleness_max``; the steps keep the ``policy_version`` they were sampled with.

        ``collect`` in the iteration's ``time_split`` is the learner's wait for completed
        trajectories; the phones' inference runs beside the learner, in
        ``async_inference_s``."""
        c = self.cfg
        self._start_collecting()
        now = k - 1
        kept: list[Trajectory] = []
        dropped: list[Trajectory] = []
        inference0 = self._collect_agent.seconds
        t0 = time.perf_counter()
        while len(kept) < c.rollouts_per_iteration:
            want = c.rollouts_per_iteration - len(kept)
            batch, self._carried = self._carried[:want], self._carried[want:]
            if len(batch) < want:
                try:
                    batch += [e.trajectory for e in self.fleet().take(want - len(batch))]
                except (JudgeUnavailable, NoDevicesLeft) as e:  # as the sync loop does
                    self._collecting = False
                    self.fleet().stop()
                    got = kept + [t for t in batch + [ep.trajectory for ep in e.episodes]
                                  if self._stale(t, now) <= c.max_staleness]
                    self._stop_run(f"online iteration {k}", self._adopt(got, k),
                                   self.screens, self._why_stopped(e))
            for t in batch:
                (kept if self._stale(t, now) <= c.max_staleness else dropped).append(t)
        self.timings["collect"] = self.timings.get("collect", 0.0) + time.perf_counter() - t0
        self._tally_unjudged("online", kept + dropped)
        kept = self._adopt(kept, k)
        self.timed("store", lambda: self._store_append(kept))
        summary = self.summary.setdefault("async", {"kept": 0, "dropped": 0})
        summary["kept"] += len(kept)
        summary["dropped"] += len(dropped)
        return kept, {"async_dropped": len(dropped),
                      "async_dropped_staleness": sorted(self._stale(t, now) for t in dropped),
                      **self._staleness_counts(kept, now),
                      "async_inference_s": round(self._collect_agent.seconds - inference0, 3)}

    @staticmethod
    def _stale(t: Trajectory, now: int) -> int:
        """Policy versions between ``now`` and ``t``'s oldest step (0 without steps)."""
        return now - min((s.policy_version for s in t.steps), default=now)

    def _staleness_counts(self, trajs: Sequence[Trajectory], now: int) -> dict[str, Any]:
        got = [self._stale(t, now) for t in trajs]
        return {"staleness": {str(v): got.count(v) for v in sorted(set(got))},
                "staleness_max": max(got, default=0)}

    def _adopt(self, trajs: list[Trajectory], k: int) -> list[Trajectory]:
        """``trajs`` from the background collection as iteration ``k``'s: renumbered, their
        screens copied into the run's table (the fleet's thread keeps writing its own),
        features filled."""
        trajs = [replace(t, iteration=k) for t in trajs]
        self._copy_screens(trajs, self._collect_screens, self.screens)
        self.features.fill(self.screens)
        return trajs

    @staticmethod
    def _copy_screens(trajs: Sequence[Trajectory], src: ScreenTable, dst: ScreenTable) -> None:
        for t in trajs:
            for st in t.steps:
                for sid in (st.screen_id, st.next_screen_id):
                    if sid not in dst:
                        image, feats = src.row(sid)
                        dst.add(image, feats, screen_id=sid)

    def _start_collecting(self) -> None:
        """Start the background collection unless it runs: the phones' own copy of the
        policy (:meth:`_publish` refreshes it; the learner never updates weights a phone is
        sampling from), a screen table of their own, and an endless stream of training
        tasks drawn from a generator seeded by the run's ``rng``. Trajectory ids are
        ``online-s{seed}-a{generation}-{k}``: the generation counts the starts over the
        run, resumes included (read back from the store), so ids never repeat."""

        from digirl_lite.vision import FeatureCache

        if self._collecting:
            return
        c = self.cfg
        pattern = re.compile(rf"online-s{c.seed}-a(\d+)-")
        stored = [int(m.group(1)) for i in self._stored_ids if (m := pattern.match(i))]
        self._generation = max([self._generation, *stored]) + 1
        if self._behaviour is None:
            self._behaviour = copy.copy(self.policy)  # the tokenizer is shared (read only)
            self._behaviour.model = copy.deepcopy(self.policy.model)
        else:
            self._behaviour.model.load_state_dict(self.policy.model.state_dict())
        self._behaviour.model.eval()
        if self._collect_screens is None:
            self._collect_screens = ScreenTable(self.img_dim)
        self._collect_agent = PolicyBatchAgent(
            self._behaviour, FeatureCache(self.features.encoder, max_items=4096),
            self._collect_screens, c.temperature, c.max_new_tokens, c.constrained_decoding,
            self.copy_text(), c.typed_span_once)
        fleet = self.fleet()
        fleet.policy_version = self.iteration
        seed = int(self.rng.integers(0, 2**31 - 1))
        kw = {"reset_options": self.world_info.reset_options(c.day)} if c.day != 1 else {}
        fleet.start(self._collect_agent, self._task_stream(np.random.default_rng(seed)),
                    self._collect_screens, id_prefix=f"online-s{c.seed}-a{self._generation:03d}",
                    source=Source.ONLINE, iteration=self.iteration + 1, seed=seed,
                    order=c.take_order, **kw)
        self._collecting = True
        self.say(f"background collection {self._generation} started at policy version "
                 f"{self.iteration} on {self.phones.n} phones")

    def _task_stream(self, rng: np.random.Generator) -> Iterator[Any]:
        """Training tasks drawn uniformly with ``rng``, without end."""
        tasks = self._train_tasks()
        while True:
            yield tasks[int(rng.integers(0, len(tasks)))]

    def _stop_collecting(self) -> None:
        """Stop the background collection (before an evaluation, at the end): episodes still
        running are lost by design (as at a kill); completed ones not yet taken are carried
        over to the next take (in ``take_order`` "start", only those that started before
        the oldest episode still running). ``summary["async"]`` counts what the stop
        discarded. The phones' screen table keeps only what those need."""
        if not self._collecting:
            return
        self._collecting = False
        stats = self.fleet().stats
        before = (stats.discarded_unfinished, stats.discarded_out_of_order)
        left = [e.trajectory for e in self.fleet().stop()]
        self._carried += left
        summary = self.summary.setdefault("async", {"kept": 0, "dropped": 0})
        for key, was, now in zip(("discarded_running", "discarded_out_of_order"), before,
                                 (stats.discarded_unfinished, stats.discarded_out_of_order)):
            summary[key] = summary.get(key, 0) + now - was
        keep = ScreenTable(self.img_dim)
        self._copy_screens(self._carried, self._collect_screens, keep)
        self._collect_screens = keep

    def _publish(self, k: int) -> None:
        """The learner's weights to the phones, inference held while they change; steps
        sampled from then on carry policy version ``k``."""
        if not self._collecting or self._behaviour is None:
            return  # the next start copies them
        with self.fleet().updating_policy(version=k):
            self._behaviour.model.load_state_dict(self.policy.model.state_dict())
