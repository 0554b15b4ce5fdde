"""The simulator's demonstrations and its pile, regenerated deterministically from a seed.

* Demonstrations: the scripted expert on *clean* screens (no surprises), the data the
  starting policy copies (the AutoUI role: a copier of people, who rarely met pop-ups in
  their recordings).
* The pile: attempts of the :class:`~digirl_lite.envs.sim.agents.Copier` (until the
  trainer's SFT policy replaces it) on the world with its surprises, scored by the oracle
  judge. Sizes as in the paper: Web Shopping 528 trajectories at H = 20, General 608 at
  H = 10 (spec section 7).
* The text they hold (:func:`sim_corpus`), what the preset's tokenizers are trained on.

The episodes are recorded by :func:`digirl_lite.rollout.pile.record_episodes`, which knows no
world; the agents, phone and tasks here are the simulator's.
"""

from __future__ import annotations

from digirl_lite.data.records import ScreenTable, Source, Trajectory
from digirl_lite.envs.sim.agents import DEFAULT_SLIP_RATE, Copier, ScriptedExpert, SlippingExpert
from digirl_lite.envs.sim.drills import vary_products, vary_queries
from digirl_lite.envs.sim.env import SimPhoneEnv
from digirl_lite.envs.sim.phrasings import rephrase_train_tasks
from digirl_lite.envs.sim.tasks import load_task_file
from digirl_lite.envs.sim.world import Surprises
from digirl_lite.paths import data_dir
from digirl_lite.rollout.pile import PileStats, episode_seed, record_episodes

__all__ = ["PILE_SIZES", "generate_pile", "generate_demos", "sim_corpus"]

PILE_SIZES = {"webshop": 528, "general": 608}
"""Off-to-on pile sizes of the paper (spec section 7)."""


def _run(
    kind: str, world: str, n: int, seed: int, make_agent, surprises: Surprises | None,
    day: int, source: Source, tasks: list[str] | None = None, layout: str = "older",
) -> tuple[list[Trajectory], ScreenTable, PileStats]:
    """``n`` episodes of ``make_agent(i)`` on a simulated phone of ``world`` (or ``tasks``)."""
    env = SimPhoneEnv(tasks or world, seed=seed, day=day, surprises=surprises, layout=layout)
    out = record_episodes(env, env.tasks, n, seed, make_agent, kind=kind, name=world,
                          source=source)
    env.close()
    return out


def generate_pile(
    world: str = "webshop", n: int | None = None, seed: int = 0,
    slip_rate: float = DEFAULT_SLIP_RATE, day: int = 1, surprises: Surprises | None = None,
) -> tuple[list[Trajectory], ScreenTable, PileStats]:
    """The copier's attempts on ``world``'s train tasks (default surprises), oracle-scored."""
    n = PILE_SIZES[world] if n is None else n
    return _run("pile", world, n, seed,
                lambda i: Copier(slip_rate=slip_rate, seed=episode_seed(seed + 7, i)),
                surprises, day, Source.OFFLINE)


def generate_demos(
    world: str = "webshop", n: int = 400, seed: int = 0, day: int = 1,
    surprise_rate: float = 0.0, varied_products: bool = False, slip_rate: float = 0.0,
    phrasing_share: float = 0.0, phrasings: str = "base", surprises: Surprises | None = None,
    layout: str = "older", popup_back_share: float = 0.0,
) -> tuple[list[Trajectory], ScreenTable, PileStats]:
    """The expert's demonstrations on ``world``'s train tasks: clean (no surprises) by
    default; ``surprise_rate`` scales the default surprise probabilities (0.1: a tenth of
    them), so a few demonstrations show how the expert closes a pop-up or voice input;
    ``varied_products`` replaces each task's product with a new one (:func:`~.drills.vary_products`;
    General: each search's names, :func:`~.drills.vary_queries`), as people searched for many more
    things than the train list names. ``slip_rate`` > 0: the demonstrator slips and
    recovers (:class:`~digirl_lite.envs.sim.agents.SlippingExpert`), so demonstrations hold
    detours, as people's do. ``phrasing_share``: that share of the tasks written
    with the train phrasings (:func:`~digirl_lite.envs.sim.phrasings.rephrase_train_tasks`:
    "Search costco.com for ...", "look for ... at ebay.com and click the first result"; on
    General "Fire up the clock app", "Google the news in Lyon"; ``phrasings`` names the set),
    as people phrase requests many ways.
    ``surprises``: the rates ``surprise_rate`` scales (None: :class:`Surprises`' defaults);
    ``layout``: the phone's dialogs (:data:`~digirl_lite.envs.sim.world.LAYOUTS`).
    ``popup_back_share``: that share of pop-ups the demonstrator closes with BACK rather
    than their X (:class:`~digirl_lite.envs.sim.agents.SlippingExpert`)."""
    tasks = None
    if varied_products or phrasing_share:
        tasks = load_task_file(data_dir() / "tasks" / f"{world}_train.txt")
        if varied_products:
            tasks = (vary_queries if world == "general" else vary_products)(tasks, n, seed)
        if phrasing_share:
            tasks = rephrase_train_tasks(tasks, phrasing_share, seed, phrasings)

    def demonstrator(i: int):
        if slip_rate or popup_back_share:
            return SlippingExpert(slip_rate, seed=episode_seed(seed + 11, i),
                                  popup_back_share=popup_back_share)
        return ScriptedExpert()

    return _run("demo", world, n, seed, demonstrator,
                (surprises or Surprises()).scaled(surprise_rate), day, Source.OFFLINE, tasks,
                layout)


def sim_corpus(seed: int = 0, n_demos: int = 300) -> list[str]:
    """Text the simulator's policy reads and writes, what its tokenizers are trained on
    (:func:`~digirl_lite.policy.tokenizer.train_sim_tokenizer`, the tiny VLM's): train
    instructions, prompts and the expert's action strings (clean demonstrations on both
    task sets)."""
    lines: list[str] = []
    for world in ("webshop", "general"):
        lines += load_task_file(data_dir() / "tasks" / f"{world}_train.txt")
        trajs, _, _ = generate_demos(world, n=n_demos, seed=seed)
        for t in trajs:
            for s in t.steps:
                lines.append(s.prompt)
                lines.append(s.action_text)
    return lines
