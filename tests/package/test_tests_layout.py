"""The tests are grouped in folders by the layer they test, and what several files need is
written once: a fixture in a ``conftest.py`` (``tests/conftest.py`` for all, a folder's own for
that folder), a helper in ``tests/needs.py``, ``judge_servers.py``, ``phone_agents.py`` or
``tiny_models.py`` (on ``sys.path`` through pytest's ``pythonpath`` setting)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

#: folder -> what its tests cover, lowest layer first (tests/package/test_layers.py)
FOLDERS = {
    "core": "actions, filters, records and stores, atomic writes, the released data",
    "judge": "judges, their HTTP backends, ground truth beside the judge",
    "learners": "critics and the learners (DigiRL, filtered BC, AWR, PPO, GRPO), data parallel",
    "envs": "the Env interface, Android over Appium, Gymnasium, OpenEnv, the UI tree",
    "rollout": "episodes, fleets, their faults, the task lifecycle",
    "policy": "the Auto-UI and VLM policies, decoding, copying, screen features, TRL",
    "sim": "the simulated phone, its worlds, tasks, phrasings, piles and server",
    "train": "the trainer, its config and CLI, checkpoints and resume, evaluation",
    "viz": "plots, films and the run report",
    "harness": "a frozen agent's harness, DarwinX, Darwin-Claw, teachers",
    "bench": "the benchmark scripts and the grid runner",
    "package": "the package as a whole: layers, sizes, README, install, notebooks, behaviour",
}

#: same name and code in two files on purpose: each binds its own file's ``Case`` class
SAME_CODE_ALLOWED = {"case"}


def test_every_test_file_sits_in_a_layer_folder():
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"test files at tests/ top level (put each in a folder of FOLDERS): {loose}"
    folders = {p.parent.name for p in TESTS.rglob("test_*.py")}
    unknown = folders - set(FOLDERS)
    assert not unknown, f"test folders not in FOLDERS (add them with what they cover): {unknown}"
    empty = set(FOLDERS) - folders
    assert not empty, f"FOLDERS lists folders with no tests: {empty}"


def _functions(path: Path):
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("test_"):
            code = ast.dump(ast.Module(body=node.body, type_ignores=[]))
            fixture = any("fixture" in ast.unparse(d) for d in node.decorator_list)
            yield node.name, code, fixture


@pytest.mark.slow
def test_no_fixture_or_helper_is_written_twice():
    """A fixture or module-level helper with the same name and the same code in two files is
    a copy: it belongs in a conftest.py or a shared helper module."""
    where = defaultdict(list)
    fixtures = defaultdict(list)
    for path in sorted(TESTS.rglob("*.py")):
        rel = str(path.relative_to(TESTS))
        for name, code, fixture in _functions(path):
            where[(name, code)].append(rel)
            if fixture and path.name != "conftest.py":
                fixtures[name].append(rel)
    copies = {name: files for (name, _), files in where.items()
              if len(files) > 1 and name not in SAME_CODE_ALLOWED}
    assert not copies, f"written twice (move to a conftest.py or a helper module): {copies}"
    shared = {c: {n for n, _, f in _functions(c) if f} for c in TESTS.rglob("conftest.py")}
    for name, files in fixtures.items():
        if name in SAME_CODE_ALLOWED:
            continue
        for rel in files:  # a test file must not shadow a shared fixture by accident
            for conftest, names in shared.items():
                folder = conftest.parent.relative_to(TESTS)
                if name in names and (folder == Path(".") or rel.startswith(f"{folder}/")):
                    raise AssertionError(f"{rel} redefines the shared fixture {name!r} of "
                                         f"{conftest.relative_to(TESTS)}")
