"""Packaging promises: a light import, the README's commands, the quickstart recipe, prompts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from needs import aitw_dir

from digirl_lite.prompts import build_prompt, task_from_prompt

ROOT = Path(__file__).resolve().parents[2]


def test_import_is_light():
    code = (
        "import sys, time; t = time.perf_counter(); import digirl_lite, digirl_lite.actions, "
        "digirl_lite.filters, digirl_lite.data, digirl_lite.prompts; "
        "heavy = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_lazy_submodules_and_clear_attribute_error():
    import digirl_lite

    assert digirl_lite.filters.mc_returns([1.0]).tolist() == [1.0]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        digirl_lite.nope  # noqa: B018


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.*?)\n```", text, re.DOTALL)


def test_readme_has_exactly_two_commands_and_ci_runs_the_test_one():
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    assert "pytest" in cmds[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert cmds[1].strip() in ci
    # the main-job command runs a recipe that exists
    script = re.search(r"python (recipes/\S+\.py)", cmds[0])
    assert script and (ROOT / script.group(1)).is_file()


@pytest.mark.slow
def test_quickstart_recipe_runs(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "recipes" / "quickstart.py"), "--out", str(tmp_path),
         "--n", "40", "--world", "general"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trajectories"] == 40
    assert 0 < summary["eq44_kept"] <= 40
    assert summary["filtered_bc_kept"] == summary["endings"].get("success", 0)
    assert (tmp_path / "parquet" / "steps.parquet").is_file()
    assert (tmp_path / "released_layout.pt").is_file()


def test_prompt_format():
    assert build_prompt("Go to ebay.com") == "Previous Actions: Goal: Go to ebay.com</s>"
    p = build_prompt("Go to ebay.com", 'Action Decision: "action_type": "PRESS_HOME"')
    assert p.startswith('Previous Actions: Action Decision: "action_type": "PRESS_HOME" Goal:')
    assert task_from_prompt(p) == "Go to ebay.com"
    assert task_from_prompt("no goal here") is None


@pytest.mark.aitw
def test_real_aitw_instructions_survive_the_prompt():
    n = 0
    for f in sorted(aitw_dir().glob("*.txt")):
        for line in f.read_text().splitlines():
            task = line.strip()
            if not task:
                continue
            assert task_from_prompt(build_prompt(task, "PRESS_HOME")) == task
            n += 1
    assert n > 1500


def test_the_policy_modules_import_without_a_circle():
    """policy/base.py (the protocol and Sample) and value_head.py import no other policy
    module; policy.py and vlm.py import base and value_head, never each other; factory.py
    names the implementations, and only inside functions (issue 28, item 4)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "digirl_lite" / "policy"

    def top_level(name):  # sibling modules imported at module level, TYPE_CHECKING included
        body = ast.parse((root / f"{name}.py").read_text()).body
        nodes = body + [n for node in body if isinstance(node, ast.If) for n in node.body]
        return {n.module.rsplit(".", 1)[-1] for n in nodes if isinstance(n, ast.ImportFrom)
                and (n.module or "").startswith("digirl_lite.policy.")}

    assert top_level("base") == set() and top_level("value_head") == set()
    assert top_level("policy") >= {"base", "value_head"} and "vlm" not in top_level("policy")
    assert "policy" not in top_level("vlm") and "vlm" not in top_level("vlm")
    assert top_level("factory") == {"base"}
