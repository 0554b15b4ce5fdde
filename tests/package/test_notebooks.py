"""The notebooks run headlessly (nbclient) on the fixture runs and fail on any error."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "data" / "fixtures" / "runs"
NOTEBOOKS = ["replay_and_grade.ipynb", "learning_curves.ipynb"]


def _execute(name: str, env: dict[str, str], monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    for k, v in env.items():
        monkeypatch.setenv(k, v)  # the kernel inherits this process's environment
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        f"{name} is committed with outputs; clear them"
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    return nb


def _outputs(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if kind in o.get("data", {})]


@pytest.mark.slow
def test_replay_and_grade_notebook_runs(monkeypatch):
    nb = _execute("replay_and_grade.ipynb", {"DIGIRL_RUN": str(FIXTURES / "digirl-seed0")},
                  monkeypatch)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "digirl seed 0" in text and "steps agree:" in text
    html = "".join(o["data"]["text/html"] for o in _outputs(nb, "text/html"))
    assert 'class="dl-traj"' in html and "dl-step" in html
    assert len(_outputs(nb, "image/png")) > 5  # replayed frames and the filmstrip


@pytest.mark.slow
def test_replay_and_grade_notebook_runs_on_a_ppo_run(monkeypatch):
    """The same notebook on the PPO fixture run: the value head's values, GAE advantages and
    recorded log-probabilities per step instead of the critics' grades."""
    nb = _execute("replay_and_grade.ipynb", {"DIGIRL_RUN": str(FIXTURES / "ppo-seed0")},
                  monkeypatch)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "ppo seed 0" in text and "OnPolicyGrader for ppo" in text
    assert "steps agree:" in text
    html = "".join(o["data"]["text/html"] for o in _outputs(nb, "text/html"))
    assert 'class="dl-traj"' in html and "logp=" in html and "V<sub>start</sub>" in html
    assert "V<sub>instr</sub>" not in html
    for column in ("V_start", "mean_A", "V_mean", "log_prob"):  # the two tables' columns
        assert f"<th>{column}</th>" in html, column


@pytest.mark.slow
def test_learning_curves_notebook_runs(monkeypatch):
    nb = _execute("learning_curves.ipynb", {"DIGIRL_RUNS": str(FIXTURES)}, monkeypatch)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    for name in ("digirl-seed0", "digirl-seed1", "filtered_bc-seed0", "filtered_bc-seed1",
                 "ppo-seed0"):
        assert name in text
    assert len(_outputs(nb, "image/png")) == 2  # the learning curves and the metrics panels
    tables = "".join(o["data"]["text/html"] for o in _outputs(nb, "text/html"))
    assert "final_success_mean" in tables
