"""Behaviour unchanged through refactors: a tiny quick job per learner (the sync loop, the
simulated phone, one thread) gives the same trajectories and the same stage table, seed for
seed, as the recorded golden in ``data/fixtures/behaviour_golden.json``.

Each run happens in a fresh subprocess with one thread, so the numbers do not depend on what
else the test process did or on the machine's core count. A change meant to alter behaviour
rewrites the golden deliberately:

    OMP_NUM_THREADS=1 python tests/package/test_behaviour_unchanged.py --write

and says so in its commit message.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "data" / "fixtures" / "behaviour_golden.json"
ALGORITHMS = ("digirl", "filtered_bc", "awr", "ppo", "grpo")
# sim_quick on a budget a refactor test can afford: every phase runs (starting-policy copier
# evaluation, pile, offline critics and actor, two online iterations, the final evaluation).
SMALL = {"pile_size": 8, "eval_tasks": 4, "iterations": 2, "rollouts_per_iteration": 4,
         "n_envs": 4, "offline_critic_updates": 2, "critic_updates": 2,
         "offline_actor_updates": 2, "actor_updates": 2, "horizon": 6, "seed": 3}


def _digest(out: Path, summary: dict) -> dict:
    """What must not move: every stored step (task, action text, reward), each
    trajectory's reward and source, and each stage's success rate."""
    from digirl_lite.data import load_trajectories

    trajs, _ = load_trajectories(out / "store", with_images=False)
    h = hashlib.sha256()
    rows = []
    for t in sorted(trajs, key=lambda t: (t.source.value, t.iteration, t.traj_id)):
        rows.append([t.source.value, t.iteration, t.task, t.final_reward,
                     [(s.action_text, s.reward) for s in t.steps]])
    h.update(json.dumps(rows, sort_keys=True).encode())
    stages = {k: round(v["success_rate"], 6) for k, v in sorted(summary["stages"].items())}
    return {"trajectories": len(rows), "steps": sum(len(r[4]) for r in rows),
            "sha256": h.hexdigest(), "stages": stages}


def run_one(algorithm: str, out: Path) -> dict:
    """One tiny quick job of ``algorithm`` in this process; its digest."""
    import torch

    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    torch.set_num_threads(1)
    cfg = sim_quick(**{**SMALL, "algorithm": algorithm})
    summary = Trainer(cfg, out, cache_dir=None, progress=False).run()
    return _digest(out, summary)


def _in_subprocess(algorithm: str, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, __file__, "--one", algorithm, str(out)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # five tiny Trainer runs, 20-40 s each
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_quick_job_gives_the_recorded_trajectories_and_table(tmp_path, algorithm):
    golden = json.loads(GOLDEN.read_text())
    assert golden["config"] == SMALL, "the golden was recorded on another budget: rewrite it"
    got = _in_subprocess(algorithm, tmp_path / algorithm)
    assert got == golden["runs"][algorithm], (
        f"{algorithm}: behaviour changed (rewrite {GOLDEN.name} only if that was meant)")


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(run_one(sys.argv[2], Path(sys.argv[3]))))
    elif sys.argv[1:] == ["--write"]:
        with tempfile.TemporaryDirectory() as d:
            runs = {a: _in_subprocess(a, Path(d) / a) for a in ALGORITHMS}
        GOLDEN.write_text(json.dumps({"config": SMALL, "runs": runs}, indent=1) + "\n")
        print(json.dumps(runs, indent=1))
    else:
        sys.exit("usage: test_behaviour_unchanged.py --write | --one ALGORITHM OUT")
