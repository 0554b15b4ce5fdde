"""An installable package: the wheel carries what the default run reads (task lists,
tokenizer, judge examples, the shipped starting policy). Installed (not editable) into a fresh
virtual environment that does not see the checkout, the main job's recipe, run by path from a
folder outside the checkout, finishes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ("tasks/webshop_train.txt", "tasks/webshop_test.txt", "tasks/general_train.txt",
          "tasks/general_test.txt", "tokenizer/spiece.model",
          "judge_examples/webshop/labels.jsonl", "judge_examples/general/labels.jsonl",
          "policies/sft-webshop/model.safetensors", "policies/sft-webshop/sft.json",
          "policies/sft-general/model.safetensors", "policies/sft-general/sft.json",
          "policies/sft-1c4141b85544/model.safetensors", "policies/sft-1c4141b85544/sft.json")


def _build_wheel(tmp: Path) -> Path:
    """The wheel of the working tree, built from a copy (nothing is written into the checkout)
    with this environment's setuptools (no download)."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "digirl_lite", src / "digirl_lite",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                    "--no-build-isolation", "--no-index", "-q", "-w", str(tmp / "dist")],
                   check=True)
    (wheel,) = (tmp / "dist").glob("digirl_lite-*.whl")
    return wheel


def _fresh_venv(tmp: Path, wheel: Path) -> tuple[Path, Path]:
    """A venv holding only the wheel; the dependencies (torch, transformers, ...) are seen
    through a .pth line naming this environment's site-packages. A .pth line only adds a
    path: the .pth files there (the checkout's editable finder) are not run."""
    venv = tmp / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                    "--no-index", "-q", str(wheel)], check=True)
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "_digirl_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py, site


@pytest.mark.slow
def test_wheel_installs_and_runs_the_main_job_outside_the_checkout(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"digirl_lite/assets/{a}" for a in ASSETS} <= names
    assert not any(n.startswith(("data/", "digirl_lite/assets/fixtures")) for n in names)
    # three 9.8 MB starting policies: the main job's two and the paper setting's General start
    assert wheel.stat().st_size < 33e6

    py, site = _fresh_venv(tmp_path, wheel)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DIGIRL_LITE_DATA", "PYTHONSAFEPATH")}
    env["OMP_NUM_THREADS"] = "1"
    recipe = ROOT / "recipes" / "offline_to_online.py"

    # what `python recipes/x.py` imports: sys.path[0] is recipes/, not the checkout
    probe = subprocess.run(
        [str(py), "-c", "import json, sys; sys.path[0] = sys.argv[1]; import digirl_lite; "
         "from digirl_lite.paths import data_dir; "
         "print(json.dumps([digirl_lite.__file__, str(data_dir())]))", str(recipe.parent)],
        cwd=cwd, env=env, check=True, capture_output=True, text=True)
    module, data = (Path(p) for p in json.loads(probe.stdout))
    assert module.is_relative_to(site) and data == site / "digirl_lite" / "assets"
    assert all((data / a).is_file() for a in ASSETS)

    # the quick main job from the shipped starting policy (its SFT settings, so it loads)
    meta = json.loads((data / "policies" / "sft-webshop" / "sft.json").read_text())
    sft = [f"{k}={json.dumps(v)}" for k, v in meta.items() if k.startswith("sft_")]
    out = tmp_path / "run"
    p = subprocess.run(
        [str(py), str(recipe), "--quick", "--quiet", "--cache-dir", "", "--out", str(out),
         "--set", "iterations=1", "eval_tasks=4", "pile_size=8", "rollouts_per_iteration=4",
         "n_envs=4", "starting_policy=shipped", *sft],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert {"copier", "offline", "online"} <= set(summary["stages"])
    loaded = [json.loads(x).get("loaded") for x in (out / "metrics.jsonl").read_text()
              .splitlines() if x.strip()]
    assert str(data / "policies" / "sft-webshop") in loaded
