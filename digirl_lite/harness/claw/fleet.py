"""Darwin-Claw on a fleet: a fleet's episodes as traces and as validation episodes, and a
:data:`~digirl_lite.harness.claw.validation.Runner` that plays them (:class:`FleetRunner`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from digirl_lite.harness.claw.triage import Trace, _tapped
from digirl_lite.harness.claw.validation import ValidationEpisode
from digirl_lite.harness.evidence import EvidenceStep


# ---------------------------------------------------------------------------------------
# from a fleet's episodes
# ---------------------------------------------------------------------------------------
def _episode_nodes(episode: Any, n: int) -> list[tuple[Any, ...] | None]:
    """Each step's UI tree as the agent saw it (``Episode.trees``: the environment reads it
    with ``ui_tree`` on; never the simulator's state)."""
    trees = list(getattr(episode, "trees", None) or [])
    return [tuple(t) if t is not None else None for t in (trees + [None] * n)[:n]]


def traces_from_episodes(episodes: Sequence[Any], width: int = 1080, height: int = 2280,
                         max_nodes: int = 60) -> list[Trace]:
    """A fleet's episodes (:class:`~digirl_lite.rollout.fleet.Episode`) as traces, the
    simulator's screens as UI trees. Episodes an infrastructure fault cut are left out
    (they say nothing about the agent)."""
    from digirl_lite.envs.uitree import tree_text

    out = []
    for ep in episodes:
        t = ep.trajectory
        if t.is_infra_truncated:
            continue
        nodes = _episode_nodes(ep, len(t.steps))
        steps = []
        for i, s in enumerate(t.steps):
            nd = nodes[i] or ()
            st = EvidenceStep(step=i, tree=tree_text(nd, max_nodes) if nd else "",
                              action=s.action_text[:300], decided_by=s.decided_by or "agent",
                              valid=s.action.is_valid,
                              screen_changed=s.screen_id != s.next_screen_id)
            tapped = _tapped(st, nd, width, height) if nd else None
            if tapped:
                n = next(x for x in nd if x.id == tapped)
                st = EvidenceStep(st.step, st.tree, st.action, st.decided_by, st.valid,
                                  st.screen_changed, {"id": n.id, "text": n.text})
            steps.append(st)
        out.append(Trace(t.traj_id, t.task, bool(t.is_success), tuple(steps), tuple(nodes),
                         t.seeds.get("env")))
    return out


def outcomes_from_episodes(episodes: Sequence[Any]) -> list[ValidationEpisode]:
    """One :class:`ValidationEpisode` per episode (its env seed, the rules that acted in it)."""
    out = []
    for ep in episodes:
        t = ep.trajectory
        out.append(ValidationEpisode(
            task=t.task, seed=int(t.seeds.get("env", -1)),
            success=None if t.is_infra_truncated else bool(t.is_success), steps=len(t.steps),
            invalid=sum(not s.action.is_valid for s in t.steps),
            hits=frozenset(s.decided_by[len("rule:"):] for s in t.steps
                           if (s.decided_by or "").startswith("rule:"))))
    return out


class FleetRunner:
    """A :data:`Runner` on a fleet: for each run of consecutive seeds, a fresh
    :class:`~digirl_lite.harness.harness.HarnessAgent` around ``make_agent(screens)``, whose
    skills are ``extra_rules_text`` (the unit under test, first) then ``components``' own
    skills; each (task, seed) is one episode at env seed ``seed`` (a run of consecutive seeds
    goes to the fleet in one ``collect``, into its own screen table).

    Args:
        fleet: a fleet (``collect``) whose environments read the UI tree (``ui_tree``).
        make_agent: ``(screens) -> StepAgent``, the frozen agent; ``screens`` is the
            :class:`~digirl_lite.data.records.ScreenTable` the fleet records the run's
            screens in (a :class:`~digirl_lite.harness.harness.PolicyAgent` reads its image
            features from it).
        components: the harness around it (None: H0).
        crn_salt: common random numbers (:attr:`PolicyAgent.crn_salt`): every call with the
            same salt, so a run with a unit and one without draw the same noise wherever the
            agent sees the same screen (None: the agent's own draws).
        collect_kwargs: passed to every ``fleet.collect`` (``reset_options`` ...).
    """

    def __init__(self, fleet: Any, make_agent: Callable[[Any], Any],
                 components: dict[str, str] | None = None, id_prefix: str = "claw",
                 width: int = 1080, height: int = 2280, crn_salt: int | None = None,
                 collect_kwargs: dict[str, Any] | None = None) -> None:
        from digirl_lite.harness.harness import H0_COMPONENTS

        self.fleet, self.make_agent = fleet, make_agent
        self.components = dict(components or H0_COMPONENTS)
        self.id_prefix, self.width, self.height = id_prefix, width, height
        self.crn_salt = crn_salt
        self.collect_kwargs = dict(collect_kwargs or {})
        self.calls = 0
        self.episodes = 0

    def __call__(self, extra_rules_text: str, tasks_seeds: Sequence[tuple[str, int]]
                 ) -> list[ValidationEpisode]:
        from digirl_lite.data.records import ScreenTable
        from digirl_lite.harness.harness import HarnessAgent

        comps = dict(self.components)
        extra = extra_rules_text.strip()
        comps["skills"] = (extra + "\n" if extra else "") + comps.get("skills", "")
        runs: list[list[tuple[str, int]]] = []
        for t, s in tasks_seeds:
            if runs and runs[-1][-1][1] + 1 == s:
                runs[-1].append((t, s))
            else:
                runs.append([(t, s)])
        out: list[ValidationEpisode] = []
        for k, run in enumerate(runs):
            screens = ScreenTable()
            agent = HarnessAgent(comps, self.make_agent(screens), self.width, self.height,
                                 where="claw runner")
            if self.crn_salt is not None:
                agent.crn_salt = self.crn_salt
            eps = self.fleet.collect(agent, [t for t, _ in run], screens,
                                     id_prefix=f"{self.id_prefix}-{self.calls}-{k}",
                                     seed=run[0][1], **self.collect_kwargs)
            out += outcomes_from_episodes(eps)
        self.calls += 1
        self.episodes += len(out)
        return out
