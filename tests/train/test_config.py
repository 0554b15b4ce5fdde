"""The config package (issue 50, items 2 and 3): field groups by concern in one flat
``DigiRLConfig``, short field docs, the simulator reached through the env factory only, old
import paths and saved configs working, and ``--print-config``."""

from __future__ import annotations

import ast
import json
import runpy
from dataclasses import fields
from pathlib import Path

import pytest

from digirl_lite.errors import ConfigError
from digirl_lite.train.config import DigiRLConfig, sim_quick

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "digirl_lite" / "train" / "config"
GROUPS = ("run", "fleet", "policy", "sft", "simulator", "evaluation", "learning", "claw")
#: the sections that live with their learners (module, dataclass)
LEARNER_SECTIONS = (("digirl_lite.learners.ppo", "OnPolicyConfig"),)


def test_every_name_the_single_module_had_imports_from_the_package():
    import digirl_lite.train.config as config

    for name in ("ConfigError", "DigiRLConfig", "load_config", "sim_webshop", "sim_quick",
                 "with_algorithm", "effective_fields", "unread", "EVAL_ONLY", "OWN_DEFAULT",
                 "WORLDS", "LEARNER_MODES", "SFT_PHONES", "ASYNC_FLEETS", "SHIPPED_SPLITS",
                 "_config_fields"):
        assert hasattr(config, name), name


def test_the_config_is_its_groups_fields_flat_each_field_in_one_group():
    import importlib

    owners: dict[str, str] = {}
    for group in GROUPS:
        module = importlib.import_module(f"digirl_lite.train.config.{group}")
        (cls,) = [c for c in vars(module).values()
                  if isinstance(c, type) and c.__module__ == module.__name__
                  and c.__name__.endswith("Config")]
        assert issubclass(DigiRLConfig, cls)
        for f in fields(cls):
            assert f.name not in owners, (f.name, owners.get(f.name), group)
            owners[f.name] = group
    for module, name in LEARNER_SECTIONS:
        cls = getattr(importlib.import_module(module), name)
        assert cls.__module__ == module and issubclass(DigiRLConfig, cls)
        for f in fields(cls):
            assert f.name not in owners, (f.name, owners.get(f.name), module)
            owners[f.name] = module
    # the old import path still works
    from digirl_lite.learners.ppo import OnPolicyConfig
    from digirl_lite.train.config.on_policy import OnPolicyConfig as old

    assert old is OnPolicyConfig
    assert set(owners) == {f.name for f in fields(DigiRLConfig)}
    assert next(iter(sim_quick().as_dict())) == "world"  # the run's fields first


def _field_docs(path: Path):
    """(class, field, docstring) of every field of every dataclass in ``path``."""
    for cls in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        body = cls.body
        for node, after in zip(body, body[1:] + [None]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                doc = (after.value.value if isinstance(after, ast.Expr)
                       and isinstance(after.value, ast.Constant) else None)
                yield cls.name, node.target.id, doc


def test_every_field_has_a_doc_of_one_or_two_lines():
    long, bare = [], []
    sections = {ROOT / (m.replace(".", "/") + ".py"): c for m, c in LEARNER_SECTIONS}
    for path in [*sorted(PACKAGE.glob("*.py")), *sections]:
        for cls, name, doc in _field_docs(path):
            if path in sections and cls != sections[path]:
                continue  # a learner's file: its config section only
            if doc is None:
                bare.append(f"{cls}.{name}")
            elif len(doc.strip().splitlines()) > 2:
                long.append(f"{cls}.{name}: {len(doc.strip().splitlines())} lines")
    assert not bare, f"fields without a docstring: {bare}"
    assert not long, "field docs over two lines (the why goes to docs/config.md):\n" + \
        "\n".join(long)


def test_the_config_does_not_import_the_simulator():
    """Its simulator facts come through the env factory (envs.setup.sim_options)."""
    bad = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}:{node.lineno}: {n}" for n in names
                    if n.startswith("digirl_lite.envs.sim")]
    assert not bad, bad


@pytest.mark.parametrize("overrides, named", [
    ({"sim_layout": "newest"}, ("sim_layout", "older, current")),
    ({"train_phrasings": "narrow"}, ("train_phrasings", "base, wide")),
    ({"sim_surprises": {"meteor": 0.1}}, ("sim_surprises", "meteor", "popup", "sponsored")),
    ({"sim_faults": {"fire": 0.1}}, ("sim_faults", "fire", "crash", "latency_median_s")),
    ({"sim_faults": {"crash": "often"}}, ("sim_faults",)),
    ({"copy_typed_text": True, "typed_span_extractor": "minilm",
      "typed_span_phrasings": "narrow"}, ("typed_span_phrasings", "base, wide")),
])
def test_simulator_fields_are_checked_against_what_the_factory_says(overrides, named):
    with pytest.raises(ConfigError) as e:
        sim_quick(**overrides)
    assert all(n in str(e.value) for n in named), str(e.value)


def test_the_factory_reports_the_simulators_options():
    from digirl_lite.envs.setup import sim_options

    sim = sim_options()
    assert sim.layouts[0] == "older" and "base" in sim.phrasing_sets
    assert "sponsored" in sim.surprises and "crash" in sim.faults
    with pytest.raises(ValueError):
        sim.check_faults({"crash": 2.0})


def test_the_configs_saved_with_older_runs_load():
    """Runs saved before many of today's fields (42 of them in the oldest fixture)."""
    saved = sorted((ROOT / "data" / "fixtures" / "runs").glob("*/summary.json"))
    assert saved
    for path in saved:
        d = json.loads(path.read_text())["config"]
        loaded = DigiRLConfig.from_dict(d).as_dict()
        assert {k: loaded[k] for k in d} == d, path


def _recipe_main():
    return runpy.run_path(str(ROOT / "recipes" / "offline_to_online.py"))["main"]


def test_print_config_prints_the_effective_config_and_builds_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    result = _recipe_main()(["--quick", "--world", "general", "--seed", "4", "--out", str(out),
                             "--set", "iterations=5", 'judge={"judge": "oracle", '
                             '"api_key": "sk-secret"}', "--print-config"])
    printed = json.loads(capsys.readouterr().out)
    assert result == {} and not out.exists()
    expected = sim_quick(world="general", seed=4, iterations=5).as_dict()
    assert printed == {**expected, "judge": {"judge": "oracle", "api_key": "***"}}


def test_print_config_with_a_bad_set_fails_as_a_run_does(tmp_path):
    main = _recipe_main()
    argv = ["--quick", "--out", str(tmp_path / "run"), "--set", "top_p=3"]
    with pytest.raises(SystemExit) as run:
        main(argv)
    with pytest.raises(SystemExit) as printed:
        main([*argv, "--print-config"])
    assert str(printed.value) == str(run.value)
    assert str(printed.value).startswith("bad configuration: top_p must be in (0, 1]")
