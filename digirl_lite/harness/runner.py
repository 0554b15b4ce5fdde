"""Running a harness on phones for DarwinX and Darwin-Claw: episodes, their outcomes, the
evidence in them, a cache that makes a killed run resumable, and evolution tasks.

:class:`HarnessRunner` plays a list of tasks at given seeds with a harness's components
through any fleet (:func:`digirl_lite.rollout.factory.make_fleet`) and returns one
:class:`Outcome` per episode. Infrastructure truncations are re-run by the fleet
(``max_task_attempts``); one that is still cut after its last attempt is returned with
``infra`` set and counts in no rate. Every call's outcomes go to a JSON-lines cache keyed by
the harness's content id, the tasks and the seeds: a run killed with ``kill -9`` replays what
it had measured instead of measuring it again.

:func:`evolution_tasks` writes the evolution set from the simulator's own site and app
descriptions, never from the test lists (spec/DARWIN.md B, "data discipline").
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from digirl_lite.harness.evidence import Evidence, EvidenceStep
from digirl_lite.harness.harness import candidate_id
from digirl_lite.harness.rules import has_overlay

__all__ = ["Outcome", "HarnessRunner", "evolution_tasks", "evidence_from", "sim_policy_runner",
           "PRODUCTS"]


@dataclass
class Outcome:
    """One episode: success (None when an infrastructure fault cut it after its last
    attempt), its length, its unparseable steps, who decided its steps, and its steps as
    evidence (with the UI tree where the environment gave it)."""

    task: str
    seed: int
    success: bool | None
    steps: int = 0
    invalid: int = 0
    decided: dict[str, int] = field(default_factory=dict)
    trace: list[dict[str, Any]] = field(default_factory=list)
    infra_reason: str | None = None

    @property
    def infra(self) -> bool:
        return self.success is None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Outcome:
        return cls(**d)


def _node_at(nodes: Sequence[Any], x: float, y: float) -> Any | None:
    hits = [n for n in nodes if n.bounds[0] <= x <= n.bounds[2] and n.bounds[1] <= y <= n.bounds[3]]
    if not hits:
        return None
    click = [n for n in hits if n.clickable] or hits
    return min(click, key=lambda n: (n.bounds[2] - n.bounds[0]) * (n.bounds[3] - n.bounds[1]))


def _trace(episode: Any, width: int, height: int, max_nodes: int) -> list[dict[str, Any]]:
    """The steps of a fleet's episode as evidence: the tree text (the UI tree the agent saw,
    ``Episode.trees``, where the environment reads it; never the simulator's state), the
    action, who decided it, whether it parsed, whether the screen changed, and the node a
    tap landed on."""
    from digirl_lite.actions import ActionType
    from digirl_lite.envs.uitree import tree_text

    out = []
    trees = list(getattr(episode, "trees", None) or [])
    for i, s in enumerate(episode.trajectory.steps):
        nodes = list(trees[i] or ()) if i < len(trees) else []
        a = s.action
        element = None
        if a.is_valid and a.action_type is ActionType.DUAL_POINT and nodes:
            n = _node_at(nodes, a.touch_yx[1] * width, a.touch_yx[0] * height)
            if n is not None:
                element = {"id": n.id, "text": n.text, "focused": bool(n.focused),
                           "clickable": bool(n.clickable)}
        out.append({"step": i, "tree": tree_text(nodes, max_nodes) if nodes else "",
                    "action": s.action_text[:300], "decided_by": s.decided_by or "agent",
                    "valid": a.is_valid, "screen_changed": s.screen_id != s.next_screen_id,
                    "element": element,
                    "overlay": bool(nodes) and has_overlay(nodes),
                    "focused": next(({"id": n.id, "text": n.text} for n in nodes
                                     if n.focused), None)})
    return out


def _outcome(episode: Any, seed: int, width: int, height: int, max_nodes: int) -> Outcome:
    t = episode.trajectory
    decided = Counter((s.decided_by or "agent") for s in t.steps)
    trace = _trace(episode, width, height, max_nodes)
    # EvidenceStep takes these fields only; the extra ones stay in the cache for readers
    return Outcome(task=t.task, seed=seed,
                   success=None if t.is_infra_truncated else bool(t.is_success),
                   steps=len(t), invalid=sum(not s.action.is_valid for s in t.steps),
                   decided=dict(decided), trace=trace,
                   infra_reason=t.truncation_reason if t.is_infra_truncated else None)


class HarnessRunner:
    """Plays tasks at seeds with a harness's components.

    Args:
        make_agent: ``(components, screens) -> batch agent`` (a
            :class:`~digirl_lite.harness.harness.HarnessAgent` around the frozen agent);
            ``screens``: the table the fleet records
            this call's screens in (a policy reads its image features from it).
        fleet: a fleet (``collect``); its environments read the UI tree (``ui_tree``).
        cache_path: the JSON-lines cache (None: no cache).
        teacher: ``batch agent`` of reference trajectories
            (:func:`~digirl_lite.harness.teachers.make_teacher`), or None.
        width, height: the screen size gestures are in.
    """

    def __init__(self, make_agent: Callable[[dict[str, str], Any], Any], fleet: Any,
                 cache_path: str | Path | None = None, teacher: Any = None,
                 width: int = 1080, height: int = 2280, max_nodes: int = 40,
                 seed_torch: bool = True) -> None:
        self.make_agent, self.fleet, self.teacher = make_agent, fleet, teacher
        self.width, self.height, self.max_nodes = width, height, max_nodes
        self.seed_torch = seed_torch
        self.cache_path = Path(cache_path) if cache_path else None
        self._cache: dict[str, list[dict[str, Any]]] = {}
        self.episodes_run = 0  # played here (not from the cache)
        self.episodes_cached = 0
        self._used: dict[str, int] = {}  # call key -> episodes, every call made here
        if self.cache_path is not None and self.cache_path.is_file():
            self._load_cache()

    def _load_cache(self) -> None:
        for n, line in enumerate(self.cache_path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                self._cache[rec["key"]] = rec["outcomes"]
            except (json.JSONDecodeError, KeyError, TypeError):
                # a line cut by kill -9 mid-write: the call is measured again
                if n < len(self.cache_path.read_text().splitlines()):
                    raise ValueError(f"{self.cache_path}, line {n}: not a cache record "
                                     "(only the last line may be cut short)") from None

    @staticmethod
    def key(cid: str, tasks: Sequence[str], seed: int, what: str = "harness") -> str:
        blob = json.dumps([what, cid, list(tasks), int(seed)])
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def _collect(self, make: Callable[[Any], Any] | None, tasks: Sequence[str], seed: int,
                 key: str) -> list[Outcome]:
        self._used[key] = len(tasks)
        if key in self._cache:
            self.episodes_cached += len(tasks)
            return [Outcome.from_dict(d) for d in self._cache[key]]
        outs = self._play(make, tasks, seed)
        self.episodes_run += len(outs)
        rec = [asdict(o) for o in outs]
        self._cache[key] = rec
        if self.cache_path is not None:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.cache_path, "a") as f:
                f.write(json.dumps({"key": key, "outcomes": rec}) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return outs

    def _play(self, make: Callable[[Any], Any], tasks: Sequence[str], seed: int
              ) -> list[Outcome]:
        """Play the episodes (the fleet; a subclass may play them elsewhere)."""
        from digirl_lite.data.records import ScreenTable

        if self.seed_torch:
            import torch

            # common random numbers: every harness samples the same tasks at the same seeds
            # from the same stream, so two variants differ by what they do, less by chance
            torch.manual_seed(int(self.key("", tasks, seed, "crn")[:8], 16))
        screens = ScreenTable()  # the agent reads the screens the fleet records here
        agent = make(screens)
        if hasattr(agent, "crn_salt"):  # the same noise for every harness at these seeds
            agent.crn_salt = seed
        episodes = self.fleet.collect(agent, list(tasks), screens, id_prefix="evo",
                                      seed=seed)
        return [_outcome(e, seed + k, self.width, self.height, self.max_nodes)
                for k, e in enumerate(episodes)]

    @property
    def distinct_episodes(self) -> int:
        """Episodes of the distinct calls made through this runner (played or cached)."""
        return sum(self._used.values())

    def run(self, components: dict[str, str], tasks: Sequence[str], seed: int) -> list[Outcome]:
        """Task ``k`` of ``tasks`` at env seed ``seed + k``, with the harness."""
        cid = candidate_id(components)
        key = self.key(cid, tasks, seed)
        if key in self._cache:
            return self._collect(None, tasks, seed, key)
        return self._collect(lambda screens: self.make_agent(components, screens), tasks,
                             seed, key)

    def run_teacher(self, tasks: Sequence[str], seed: int) -> list[Outcome]:
        """The teacher's reference episodes for ``tasks`` at the same seeds."""
        if self.teacher is None:
            return []
        # the expert's episodes keep the key they were cached under before there was a choice
        name = getattr(self.teacher, "teacher_name", "privileged_expert")
        what = "teacher" if name == "privileged_expert" else f"teacher:{name}"
        return self._collect(lambda screens: self.teacher, tasks, seed,
                             self.key("teacher", tasks, seed, what))


# ---------------------------------------------------------------------------------------
# evidence
# ---------------------------------------------------------------------------------------
def _theme(o: Outcome) -> tuple[str, int]:
    """A failed episode's theme and the step where it went wrong."""
    for s in o.trace:
        if not s["valid"]:
            return "unparseable", s["step"]
    for s in o.trace:
        if s.get("overlay") and not s["screen_changed"]:
            return "overlay", s["step"]
    for s in o.trace:
        if s.get("overlay"):
            return "overlay", s["step"]
    for a, b in zip(o.trace, o.trace[1:]):
        if not a["screen_changed"] and not b["screen_changed"] and a["action"] == b["action"]:
            return "stuck", b["step"]
    if o.steps and o.trace and o.trace[-1]["action"] and "STATUS_TASK_COMPLETE" in \
            o.trace[-1]["action"]:
        return "wrong_page", o.steps - 1
    return "budget", max(o.steps - 1, 0)


def _steps(o: Outcome) -> tuple[EvidenceStep, ...]:
    keep = ("step", "tree", "action", "decided_by", "valid", "screen_changed", "element")
    return tuple(EvidenceStep(**{k: s.get(k) for k in keep}) for s in o.trace)


def evidence_from(outcomes: Sequence[Outcome], teacher: Sequence[Outcome] = (),
                  limit: int = 24) -> list[Evidence]:
    """Failure-, teacher- and self-derived evidence from one evaluation's episodes.

    Failure: each failed episode (theme and the step where it went wrong). Self: the
    agent's own passes, one per task it solved: for a task it both solved and failed, a
    pass beside a failure (``contrast``); for a task it always solved, the pass alone (what
    it did on screens from which it went on to succeed: Agent Workflow Memory's examples,
    issue 48). Teacher: a task it never solved, with the teacher's episode at the failure's
    seed (``teacher``, matched by task and seed). At most ``limit`` of each kind, in task
    order; of self evidence, the contrasted passes first."""
    by_task: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if not o.infra:
            by_task.setdefault(o.task, []).append(o)
    failure, contrasted, alone, teach = [], [], [], []
    tmap = {(t.task, t.seed): t for t in teacher if t.success}
    for task, outs in by_task.items():
        fails = [o for o in outs if not o.success]
        wins = [o for o in outs if o.success]
        for f in fails:
            theme, at = _theme(f)
            failure.append(Evidence("failure", task, _steps(f), at=at, theme=theme,
                                    summary=f"failed after {f.steps} steps ({theme} at step "
                                            f"{at})"))
        if wins and fails:
            theme, at = _theme(fails[0])
            contrasted.append(Evidence("self", task, _steps(wins[0]), _steps(fails[0]), at=at,
                                       theme=theme,
                                       summary=f"solved {len(wins)} of {len(outs)}"))
        elif wins:
            alone.append(Evidence("self", task, _steps(wins[0]),
                                  summary=f"solved {len(wins)} of {len(outs)}"))
        if not wins and fails:
            for f in fails:
                ref = tmap.get((task, f.seed))
                if ref is not None:
                    theme, at = _theme(f)
                    teach.append(Evidence("teacher", task, _steps(ref), _steps(f), at=at,
                                          theme=theme, summary="never solved; the teacher's "
                                                               "episode at the same seed"))
                    break
    return failure[:limit] + teach[:limit] + (contrasted + alone)[:limit]


# ---------------------------------------------------------------------------------------
# evolution tasks
# ---------------------------------------------------------------------------------------
PRODUCTS = (
    "wireless earbuds", "usb c charger", "gaming mouse", "mechanical keyboard",
    "4k monitor", "portable ssd", "bluetooth speaker", "noise cancelling headphones",
    "laptop stand", "webcam", "smart watch", "robot vacuum", "air fryer", "coffee maker",
    "electric toothbrush", "hair dryer", "yoga mat", "running shoes", "backpack",
    "water bottle", "desk lamp", "office chair", "hdmi cable", "wifi router", "power bank",
    "tablet case", "phone tripod", "microsd card", "printer ink", "graphics card",
    "instant camera", "fitness tracker", "space heater", "blender", "toaster",
    "rice cooker", "dash cam", "baby monitor", "drone", "e reader",
)
"""Things people shop for, written here (not taken from any task list)."""


def evolution_tasks(world: str = "webshop", n: int = 24, seed: int = 0,
                    exclude: Sequence[str] = ()) -> list[str]:
    """``n`` tasks written from the simulator's site (Web Shopping) or app (General)
    descriptions, in the three Web Shopping shapes (go to a site; search it; select the
    first entry) or General's (open an app; search Google). Instructions in ``exclude``
    (pass the test lists) and any query a test instruction holds are never produced."""
    from digirl_lite.envs.sim.catalog import APPS, SITES, TRAIN_SITES
    from digirl_lite.envs.sim.tasks import parse_task

    rng = np.random.default_rng(seed)
    banned = {e.strip().lower() for e in exclude}
    banned_q = set()
    for e in exclude:
        try:
            q = parse_task(e).query
        except ValueError:
            q = None
        if q:
            banned_q.add(q.strip().lower())
    out: list[str] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n and tries < 100 * n:
        tries += 1
        if world == "webshop":
            site = SITES[TRAIN_SITES[int(rng.integers(len(TRAIN_SITES)))]]
            prod = PRODUCTS[int(rng.integers(len(PRODUCTS)))]
            level = int(rng.choice([1, 2, 3, 3]))
            text = (f"Go to {site.domain}" if level == 1 else
                    f'Go to {site.domain}, search for "{prod}"' if level == 2 else
                    f'Go to {site.domain}, search for "{prod}", and select the first entry')
            q = prod if level > 1 else None
        else:
            if rng.random() < 0.5:
                app = list(APPS.values())[int(rng.integers(len(APPS)))]
                text, q = f"Open the {app.aliases[0]} app", None
            else:
                prod = PRODUCTS[int(rng.integers(len(PRODUCTS)))]
                text, q = f"Search for {prod} reviews", f"{prod} reviews"
        if text.lower() in banned or text in seen or (q and q.lower() in banned_q):
            continue
        parse_task(text)  # the simulator models it
        seen.add(text)
        out.append(text)
    if len(out) < n:
        raise ValueError(f"only {len(out)} evolution tasks could be written for {world!r}")
    return out


def sim_policy_runner(world: str = "webshop", n_envs: int = 16,
                      cache_path: str | Path | None = None, fleet: str = "sync",
                      temperature: float = 1.0, starting_policy: str | Path | None = None,
                      env: dict[str, Any] | None = None, teacher: str = "screen"
                      ) -> tuple[HarnessRunner, Any]:
    """A runner for the frozen shipped starting policy (or ``starting_policy``, a saved
    policy's directory) on simulated phones that read their UI tree, with ``teacher`` (one
    of :data:`~digirl_lite.harness.teachers.TEACHERS`); the phones give no ``obs.state``
    unless the teacher reads it. Returns ``(runner, policy)``."""
    from digirl_lite.envs.sim.env import SimEnvFactory
    from digirl_lite.harness.harness import HarnessAgent, PolicyAgent
    from digirl_lite.harness.teachers import make_teacher, reads_state
    from digirl_lite.paths import data_dir
    from digirl_lite.policy.factory import load_policy
    from digirl_lite.rollout.factory import make_fleet
    from digirl_lite.vision import FeatureCache, SimScreenEncoder

    path = Path(starting_policy) if starting_policy else data_dir() / "policies" / f"sft-{world}"
    policy = load_policy(path)
    features = FeatureCache(SimScreenEncoder(dim=policy.img_dim, seed=0))
    def make_agent(components: dict[str, str], screens: Any) -> HarnessAgent:
        return HarnessAgent(components, PolicyAgent(policy, features, screens, temperature))

    if "privileged_state" in (env or {}):
        raise ValueError("env: privileged_state follows the teacher (on for "
                         "'privileged_expert' only); do not set it")
    # no obs.state on the phones unless the teacher is the privileged one (issue 48)
    fl = make_fleet(fleet, SimEnvFactory(tasks=world, ui_tree=True, **(env or {}),
                                         privileged_state=reads_state(teacher)), n_envs)
    return HarnessRunner(make_agent, fl, cache_path, make_teacher(teacher)), policy
