"""benchmarks/recoveries_in_data.py: the ways back a run's stored episodes took, read from a
replay of each on the run's own phone."""

from __future__ import annotations

import json

import pytest

from benchmarks.recoveries_in_data import recoveries


def _run_folder(path, surprise_rate: float, n: int = 12):
    """A run folder holding the expert's episodes as a pile (``surprise_rate`` 1: the
    default surprises, which the expert answers; 0: none)."""
    from digirl_lite.data import TrajectoryStore
    from digirl_lite.envs.sim.demos import generate_demos

    trajs, screens, _ = generate_demos("webshop", n=n, seed=3, surprise_rate=surprise_rate)
    assert all(t.iteration == -1 for t in trajs)  # offline: the script's "pile"
    TrajectoryStore.create(path / "store", screens.feature_dim).append(trajs, screens)
    sim = {} if surprise_rate else {k: 0.0 for k in ("popup", "consent", "voice", "reorder",
                                                     "blank", "sponsored")}
    (path / "summary.json").write_text(json.dumps({"config": {
        "world": "webshop", "seed": 3, "algorithm": "digirl", "sim_surprises": sim}}))
    return trajs


@pytest.mark.slow  # replays 24 episodes (~2 s)
def test_the_expert_answering_surprises_takes_ways_back_and_without_them_none(tmp_path):
    with_surprises = _run_folder(tmp_path / "a", 1.0)
    rep = recoveries(tmp_path / "a")
    pile = rep["sources"]["pile"]
    assert rep["replay_mismatches"] == 0
    assert pile["attempts"] == len(with_surprises)
    assert pile["successes"] == sum(t.final_reward > 0 for t in with_surprises)
    assert 0 < pile["successes_with_way_back"] <= pile["successes"]
    assert sum(pile["ways_back_in_successes"].values()) >= pile["successes_with_way_back"]
    _run_folder(tmp_path / "b", 0.0)
    calm = recoveries(tmp_path / "b")["sources"]["pile"]
    assert calm["successes"] > 0 and calm["successes_with_way_back"] == 0
    assert calm["ways_back_in_all"] == {}
