"""The package's folders form layers: each one imports only those below it, never a circle.

Every module under ``digirl_lite/`` is parsed (not imported) and every import counts: at
module level, inside functions, under ``TYPE_CHECKING``, and module paths written as strings
(the lazy exports of the packages' ``__init__``). The layers, lowest first:

    _lazy, errors, paths, actions, prompts, filters,   the top-level modules (a new one
    ppo, distributed, redaction                         that imports none of the package
                                                        is one of them)
    data                                                records, stores, replay
    judge, critics                                      the judge interface, the VLM judge
                                                        and the oracles; the critics
    envs                                                the Env interface, Android, the
                                                        judge factory (no simulator)
    rollout                                             episodes, fleets, recording a pile
    policy, vision                                      the Auto-UI policy; features
    learners                                            one file per algorithm
    envs.sim                                            the simulated phone, its agents,
                                                        demonstrations and copy drills
    envs.factory                                        the env factory (envs/setup.py, the
                                                        envs package): phones and WorldInfo
                                                        from a config, simulator or Android
    viz                                                 plots, films, regrading
    harness                                             the harness around an agent, its
                                                        rules, DarwinX's engine, Darwin-Claw's
                                                        units and bank (a training run's
                                                        ``claw`` option uses them)
    report, train                                       the run report; the trainer
    harness.runs                                        the runs around a frozen policy
                                                        (harness/frozen.py, evolve.py,
                                                        claw/run.py: they read the trainer's
                                                        config and run its evaluation)

A folder may import its own layer's neighbours as long as no circle forms; an import that
goes up a layer fails with the line that makes it. The simulator sits above the policy, the
rollout and Android, so they take what they need of a world as arguments or from the env
factory, and the trainer takes it from the env factory (``world_info``, the simulator's
demonstrations and drills); nothing is exempt.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "digirl_lite"

LAYERS: list[set[str]] = [
    {"_lazy", "errors", "paths", "actions", "prompts", "filters", "ppo", "distributed",
     "redaction", "provenance"},
    {"data"},
    {"judge", "critics"},
    {"envs"},
    {"rollout"},
    {"policy", "vision"},
    {"learners"},
    {"envs.sim"},
    {"envs.factory"},
    {"viz"},
    {"harness"},
    {"report", "train"},
    {"harness.runs"},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}

FACTORY = {"digirl_lite.envs", "digirl_lite.envs.setup"}
"""The env factory's modules: the only ones of ``envs/`` outside ``envs/sim/`` that may
import the simulator."""

RUNS = {"digirl_lite.harness.frozen", "digirl_lite.harness.evolve",
        "digirl_lite.harness.claw.run"}
"""The harness's runs around a frozen policy: the only modules of ``harness/`` that may
import the trainer."""

Edge = tuple[str, str]  # (importing unit, imported unit)
Where = tuple[str, int, str]  # (file, line, imported module)


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _unit(module: str) -> str | None:
    """The layer unit of ``digirl_lite.X...``: the subpackage or top-level module X, except
    in ``envs``: the simulator (``envs.sim``) and the env factory (``envs.factory``) are
    layers of their own above the rest of it; in ``harness``, its runs (``harness.runs``) are
    a layer above the trainer."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if module in RUNS:
        return "harness.runs"
    if parts[1] == "envs":
        if module in FACTORY:
            return "envs.factory"
        if len(parts) > 2 and parts[2] == "sim":
            return "envs.sim"
    return parts[1]


def _imports(module: str, path: Path, modules: dict[str, Path]):
    """Every ``digirl_lite`` module that ``module`` names, with its line."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value in modules:  # lazy exports, import_module("digirl_lite....")
            names = [node.value]
        for name in dict.fromkeys(names):
            if name == "digirl_lite" or name.startswith("digirl_lite."):
                yield name, node.lineno


def unit_graph(root: Path = PACKAGE) -> dict[Edge, list[Where]]:
    """Imports between units (subpackages and top-level modules) with where they happen.
    The package's own ``__init__`` (which names every unit lazily) is left out."""
    modules = _modules(root)
    edges: dict[Edge, list[Where]] = defaultdict(list)
    for module, path in modules.items():
        src = _unit(module)
        if src is None:
            continue
        where = path.relative_to(root.parent).as_posix()
        for name, line in _imports(module, path, modules):
            dst = _unit(name)
            if dst is None or dst == src:
                continue
            edges[(src, dst)].append((where, line, name))
    return dict(edges)


def find_cycles(edges) -> list[list[str]]:
    """Strongly connected components with more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph[b]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _explain(edges: dict[Edge, list[Where]], units: list[str]) -> str:
    lines = []
    for (a, b), where in sorted(edges.items()):
        if a in units and b in units:
            lines += [f"  {a} -> {b}: {f}:{n} imports {m}" for f, n, m in where[:5]]
    return "\n".join(lines)


@pytest.mark.slow
def test_no_circle_between_subpackages():
    edges = unit_graph()
    cycles = find_cycles(edges)
    assert not cycles, "import circles between folders:\n" + "\n\n".join(
        f"{' <-> '.join(c)}\n{_explain(edges, c)}" for c in cycles)


@pytest.mark.slow
def test_every_import_goes_down_the_layers():
    edges = unit_graph()
    rank = dict(RANK)
    for unit in {u for e in edges for u in e} - set(rank):
        # a unit not in LAYERS that imports nothing of the package sits at the bottom
        assert not any(a == unit for a, _ in edges), \
            f"{unit!r} imports other folders: add it to LAYERS in tests/package/test_layers.py"
        rank[unit] = 0
    upward = {e: w for e, w in edges.items() if rank[e[1]] > rank[e[0]]}
    assert not upward, "imports that go up a layer (see LAYERS):\n" + _explain(
        upward, sorted({u for e in upward for u in e}))


def test_the_check_sees_a_circle(tmp_path):
    """A circle added anywhere, even by an import inside a function, is found."""
    pkg = tmp_path / "digirl_lite"
    for sub in ("envs", "judge", "rollout"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "envs" / "env.py").write_text("from digirl_lite.judge.base import Judge\n")
    (pkg / "judge" / "base.py").write_text(
        "class Judge:\n    def judge(self):\n        from ..rollout import episode\n")
    (pkg / "rollout" / "episode.py").write_text("import digirl_lite.envs.env\n")
    edges = unit_graph(pkg)
    assert set(edges) == {("envs", "judge"), ("judge", "rollout"), ("rollout", "envs")}
    assert find_cycles(edges) == [["envs", "judge", "rollout"]]
    (pkg / "rollout" / "episode.py").write_text("")
    assert find_cycles(unit_graph(pkg)) == []
    # a lazy export names its module as a string
    (pkg / "rollout" / "__init__.py").write_text(
        "_NAMES = {'Judge': 'digirl_lite.judge.base'}\n")
    (pkg / "judge" / "__init__.py").write_text("_NAMES = {'X': 'digirl_lite.rollout'}\n")
    assert ["judge", "rollout"] in find_cycles(unit_graph(pkg))


def test_the_moved_modules_import_light():
    """The judge package, the environments' judge factory and the fleet factory load no
    torch, transformers or datasets (``import digirl_lite``: tests/package/test_package.py)."""
    code = ("import sys, digirl_lite.judge, digirl_lite.envs.judges, digirl_lite.rollout.factory; "
            "heavy = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


BELOW_THE_SIMULATOR = ("digirl_lite/train/", "digirl_lite/policy/", "digirl_lite/rollout/",
                       "digirl_lite/envs/android/")


def sim_imports(root: Path = PACKAGE) -> list[Where]:
    """Every import of the simulator (``digirl_lite.envs.sim...``) from a file under
    :data:`BELOW_THE_SIMULATOR`, at module level or inside a function."""
    modules = _modules(root)
    out = []
    for module, path in modules.items():
        where = path.relative_to(root.parent).as_posix()
        if not where.startswith(BELOW_THE_SIMULATOR):
            continue
        out += [(where, line, name) for name, line in _imports(module, path, modules)
                if name == "digirl_lite.envs.sim" or name.startswith("digirl_lite.envs.sim.")]
    return out


@pytest.mark.slow
def test_nothing_below_the_simulator_imports_it():
    """The trainer, the policy, the rollout and Android take what they need of a world as
    arguments or from the env factory, never from ``envs.sim``."""
    found = sim_imports()
    assert not found, "imports of the simulator from below it:\n" + "\n".join(
        f"  {f}:{n} imports {m}" for f, n, m in found)


def test_the_check_sees_an_import_of_the_simulator(tmp_path):
    """An import of ``envs.sim`` from the policy, even inside a function, fails both the
    layer order and the direct check; the env factory and the simulator's own modules may
    import it."""
    pkg = tmp_path / "digirl_lite"
    for sub in ("envs", "envs/sim", "envs/android", "policy"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "envs" / "base.py").write_text("")
    (pkg / "envs" / "sim" / "demos.py").write_text("from digirl_lite.envs.base import *\n")
    (pkg / "envs" / "setup.py").write_text(
        "def make():\n    from digirl_lite.envs.sim import demos\n")
    (pkg / "policy" / "tokenizer.py").write_text("import digirl_lite.envs.base\n")
    assert all(RANK[b] <= RANK[a] for a, b in unit_graph(pkg)) and not sim_imports(pkg)
    (pkg / "policy" / "tokenizer.py").write_text(
        "def corpus():\n    from digirl_lite.envs.sim.demos import sim_corpus\n")
    assert ("policy", "envs.sim") in unit_graph(pkg)
    assert sim_imports(pkg) == [("digirl_lite/policy/tokenizer.py", 2,
                                 "digirl_lite.envs.sim.demos")]
