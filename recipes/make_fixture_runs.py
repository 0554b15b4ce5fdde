"""Regenerate the small run folders in ``data/fixtures/runs`` that the viewer's tests, the
report's test and the notebooks read (issue 8).

    python recipes/make_fixture_runs.py --out data/fixtures/runs

Each run is written by the real :class:`~digirl_lite.train.Trainer` on a tiny budget, with one
change: a scripted *stand-in* acts instead of the policy (collection and evaluation), so the
curves move in a minute of CPU. The stand-in plays each episode as the simulator's
:class:`ScriptedExpert` with probability ``skill``, else as the :class:`Copier` (which does not
recover from surprises), and writes a cut-off, unparsable action string at ``invalid_rate``
per step, as a sampling policy does early on. ``skill`` grows with every evaluation the run
has done, faster for "digirl" than for "filtered_bc": **the curves are made up; the critics,
filters, stores, metrics and checkpoints are the Trainer's own.**

Written per run: metrics.jsonl, summary.json, learning_curve.png. The first run (digirl,
seed 0) also keeps eval/<stage>/ (every evaluation episode, with screen features) and its last
checkpoint's critics (``checkpoints/iter-NNNN/state.pt`` with ``step_critic`` and
``instr_critic`` only; hidden width 32 instead of 256 to stay small); the policy, optimiser
states and the training store are dropped (megabytes; nothing here reads them).

``ppo-seed0`` is a PPO run (issue 17) of a *tiny* policy (:data:`TINY_POLICY`, 1.2 MB saved;
the simulator's is 10 MB), acted for by the same stand-ins; each stand-in string carries the
tiny policy's token ids and teacher-forced log-probabilities, as if the policy had sampled it,
so the PPO learner trains on every step. It keeps eval/offline/ and eval/online/ (4 tasks
each) and its last checkpoint's policy (with the value head: the report's per-step values and
advantages), nothing else.
Regenerate it alone with ``--only ppo-seed0`` (the other runs are left as they are).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

RUNS = (("digirl", 0, True), ("digirl", 1, False), ("filtered_bc", 0, False),
        ("filtered_bc", 1, False))
"""(algorithm, seed, keep trajectories and critics)."""
SKILL_STEP = {"digirl": 0.2, "filtered_bc": 0.1}
"""How much the stand-in's skill grows per evaluation done (made up, see the docstring)."""
PPO_RUN = ("ppo", 0)
"""(algorithm, seed) of the PPO fixture run (see :func:`make_ppo_run`)."""
TINY_POLICY = {"d_model": 16, "d_kv": 8, "d_ff": 32, "num_layers": 1, "num_decoder_layers": 1,
               "num_heads": 2}
"""The PPO fixture's policy: :meth:`AutoUIPolicy.sim_preset` with these overrides."""
PPO_EVAL_DROPPED = ("copier", "online-1")
"""Evaluation stores the PPO fixture drops (screens are most of its size)."""
CRITIC_HIDDEN = 16
"""The fixture's step critic width (the Trainer's is 256: 3.4 MB of weights)."""


class StandIn:
    """Expert with probability ``skill`` per episode, else copier; cut-off strings at
    ``invalid_rate`` per step."""

    def __init__(self, skill: float, invalid_rate: float, seed: int) -> None:
        from digirl_lite.envs.sim import Copier, ScriptedExpert

        self.skill, self.invalid_rate = skill, invalid_rate
        self.rng = np.random.default_rng(seed)
        self.expert, self.copier = ScriptedExpert(), Copier(seed=seed)
        self.current = self.copier

    def act(self, obs) -> str:
        if obs.step == 0:
            self.current = self.expert if self.rng.random() < self.skill else self.copier
        text = self.current.act(obs)
        if self.rng.random() < self.invalid_rate:
            return text[: len(text) // 2]
        return text


def make_run(out: Path, algorithm: str, seed: int, keep: bool) -> dict:
    import torch

    from digirl_lite.critics import StepCritic
    from digirl_lite.rollout.fleet import ScriptedBatchAgent
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    cfg = sim_quick(algorithm=algorithm, seed=seed, starting_policy="sft", sft_demos=8,
                    sft_updates=2, sft_copy_updates=20, pile_size=16, iterations=2,
                    rollouts_per_iteration=8, n_envs=4, eval_tasks=5,
                    eval_every=1, offline_critic_updates=60, offline_actor_updates=1,
                    critic_updates=30, critic_lr=1e-3, actor_updates=1, actor_batch=4,
                    top_p=0.25)
    trainer = Trainer(cfg, out, cache_dir=None, progress=False)
    # small critics (see CRITIC_HIDDEN), trained by the Trainer's own loop
    trainer.step_critic = StepCritic(trainer.text.encoder.dim, trainer.policy.img_dim,
                                     hidden=CRITIC_HIDDEN, init_value=cfg.critic_init_value)
    trainer.critic_opt = torch.optim.Adam(
        list(trainer.step_critic.parameters()) + list(trainer.instr_critic.parameters()),
        lr=cfg.critic_lr)

    def stand_in(screens=None):
        skill = min(0.9, SKILL_STEP[algorithm] * len(trainer.summary["stages"]))
        base = seed * 1000 + 10 * len(trainer.summary["stages"])
        return ScriptedBatchAgent(lambda slot: StandIn(skill, 0.04, base + slot))

    trainer.agent = stand_in
    summary = trainer.run()

    shutil.rmtree(out / "store", ignore_errors=True)
    ckpts = out / "checkpoints"
    if keep:
        latest = ckpts / (ckpts / "latest").read_text().strip()
        for p in ckpts.iterdir():
            if p.is_dir() and p != latest:
                shutil.rmtree(p)
        shutil.rmtree(latest / "policy")
        state = torch.load(latest / "state.pt", map_location="cpu", weights_only=True)
        torch.save({k: state[k] for k in ("step_critic", "instr_critic")}, latest / "state.pt")
        meta = json.loads((latest / "state.json").read_text())
        (latest / "state.json").write_text(json.dumps(
            {k: meta[k] for k in ("iteration", "online_trajectories", "curve")}))
    else:
        shutil.rmtree(ckpts, ignore_errors=True)
        shutil.rmtree(out / "eval", ignore_errors=True)
    for p in out.iterdir():  # anything else the Trainer may add (e.g. tensorboard/)
        if p.name not in ("metrics.jsonl", "summary.json", "learning_curve.png", "eval",
                          "checkpoints"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    return {s: round(r["success_rate"], 3) for s, r in summary["stages"].items()}


class ScoredStandIns:
    """:class:`StandIn` strings (one per phone) carrying ``policy``'s token ids and their
    teacher-forced log-probabilities, as :meth:`AutoUIPolicy.sample` records a draw, so an
    on-policy learner has a ratio for every step."""

    def __init__(self, policy, features, screens, skill: float, base: int) -> None:
        from digirl_lite.policy.agent import PolicyBatchAgent
        from digirl_lite.rollout.fleet import ScriptedBatchAgent

        self.policy = policy
        self.inner = ScriptedBatchAgent(lambda slot: StandIn(skill, 0.04, base + slot))
        self.features = PolicyBatchAgent(policy, features, screens)  # features, cached
        self.seconds, self.calls = 0.0, 0  # what the Trainer reads of a PolicyBatchAgent

    def act_batch(self, slots, observations):
        import torch

        from digirl_lite.data.records import screen_id_of_image
        from digirl_lite.policy.on_policy import text_token_ids
        from digirl_lite.rollout.episode import SampledAction

        t0 = time.perf_counter()
        texts = self.inner.act_batch(slots, observations)
        feats = self.features.features_of([o.screen_id or screen_id_of_image(o.screenshot)
                                           for o in observations])
        ids = text_token_ids(self.policy, texts)
        with torch.no_grad():
            lp, _, _ = self.policy.token_ids_log_probs_and_values(
                [o.prompt for o in observations], feats, ids)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return [SampledAction(t, i, lp[b, :len(i)].tolist())
                for b, (t, i) in enumerate(zip(texts, ids))]


def make_ppo_run(out: Path, seed: int = 0) -> dict:
    """The PPO fixture run: a tiny policy (:data:`TINY_POLICY`) trained by the real Trainer's
    PPO learner on the stand-ins' steps; keeps eval/ and the last checkpoint's policy."""
    import tempfile

    from digirl_lite.policy import AutoUIPolicy
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        AutoUIPolicy.sim_preset(seed=seed, **TINY_POLICY).save(Path(tmp) / "tiny")
        cfg = sim_quick(algorithm="ppo", seed=seed, starting_policy=str(Path(tmp) / "tiny"),
                        pile_size=8, iterations=2, rollouts_per_iteration=8, n_envs=4,
                        eval_tasks=4, eval_every=1, critic_warmup_updates=10,
                        ppo_minibatch=8, ppo_epochs=2, actor_lr=1e-3,
                        offline_imitation=False)
        trainer = Trainer(cfg, out, cache_dir=None, progress=False)

        def stand_in(screens=None):
            skill = min(0.9, SKILL_STEP["digirl"] * len(trainer.summary["stages"]))
            base = seed * 1000 + 10 * len(trainer.summary["stages"])
            return ScoredStandIns(trainer.policy, trainer.features,
                                  screens if screens is not None else trainer.screens,
                                  skill, base)

        trainer.agent = stand_in
        summary = trainer.run()

    shutil.rmtree(out / "store", ignore_errors=True)
    for stage in PPO_EVAL_DROPPED:  # their records stay in metrics.jsonl and summary.json
        shutil.rmtree(out / "eval" / stage, ignore_errors=True)
    ckpts = out / "checkpoints"
    latest = ckpts / (ckpts / "latest").read_text().strip()
    for p in ckpts.iterdir():
        if p.is_dir() and p != latest:
            shutil.rmtree(p)
    (latest / "state.pt").unlink()  # critics (unused by PPO) and optimiser states
    for p in (latest / "policy").glob("sft*"):
        p.unlink()
    meta = json.loads((latest / "state.json").read_text())
    (latest / "state.json").write_text(json.dumps(
        {k: meta[k] for k in ("iteration", "online_trajectories", "curve")}))
    for p in out.iterdir():
        if p.name not in ("metrics.jsonl", "summary.json", "learning_curve.png", "eval",
                          "checkpoints"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    return {s: round(r["success_rate"], 3) for s, r in summary["stages"].items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="data/fixtures/runs", help="replaced if it exists")
    ap.add_argument("--only", default=None,
                    help="regenerate only this run (e.g. ppo-seed0), leaving the others")
    args = ap.parse_args(argv)
    root = Path(args.out)
    ppo_name = f"{PPO_RUN[0]}-seed{PPO_RUN[1]}"
    if args.only == ppo_name:
        shutil.rmtree(root / ppo_name, ignore_errors=True)
        t0 = time.perf_counter()
        report = {ppo_name: make_ppo_run(root / ppo_name, PPO_RUN[1])}
        print(ppo_name, report[ppo_name], f"{time.perf_counter() - t0:.0f} s", flush=True)
        return report
    if args.only is not None:
        raise SystemExit(f"--only: {ppo_name} is the only run regenerated alone")
    if root.exists():
        shutil.rmtree(root)
    report = {}
    t0 = time.perf_counter()
    report[ppo_name] = make_ppo_run(root / ppo_name, PPO_RUN[1])
    print(ppo_name, report[ppo_name], f"{time.perf_counter() - t0:.0f} s", flush=True)
    for algorithm, seed, keep in RUNS:
        t0 = time.perf_counter()
        name = f"{algorithm}-seed{seed}"
        report[name] = make_run(root / name, algorithm, seed, keep)
        print(name, report[name], f"{time.perf_counter() - t0:.0f} s", flush=True)
    mb = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 1e6
    print(f"{root}: {mb:.2f} MB")
    return report


if __name__ == "__main__":
    main()
