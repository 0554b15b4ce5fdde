"""The main job over the wire against the same job in process (issue 14, item 7).

Both runs are the default main job (``sim_webshop``: the shipped starting policy, pile,
offline phase, 30 online iterations, evaluations on the first 96 test tasks) with the same
seed. The in-process run steps ``SimPhoneEnv`` objects and takes the simulator's oracle as
its judge; the wire run serves 16 simulated phones, each in its own process, over the
WebDriver/Appium protocol (``python -m digirl_lite.envs.sim.serve``), drives them through
``AndroidEnv`` and appium-python-client, and takes the phones' own success check
(``{"judge": "env"}``). Only ``env``, ``android`` and ``judge`` differ.

    python benchmarks/bench_over_wire.py --out runs/wire_bench           # both, ~1 h on 2 CPUs
    python benchmarks/bench_over_wire.py --out runs/wire_bench --parallel  # side by side
    python benchmarks/bench_over_wire.py --out runs/wire_bench --only wire
    python benchmarks/bench_over_wire.py --out runs/wire_bench --table-only

Prints held-out success per stage (95% intervals), mean episode length, wall time, and the
online iteration's time split (how much of it the environments take in each), and writes
``benchmarks/results/bench_over_wire.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("copier", "offline", "online")


def start(kind: str, out: Path, seed: int, phones: int, extra: list[str],
          threads: int | None) -> tuple[subprocess.Popen, list]:
    cmd = [sys.executable, str(ROOT / "recipes" / "offline_to_online.py"), "--seed", str(seed),
           "--out", str(out / kind), "--cache-dir", "", "--quiet", "--processes", "1", *extra]
    procs = []
    if kind == "wire":
        from digirl_lite.envs.sim.serve import spawn_phones

        procs = spawn_phones(phones, world="webshop", seed=seed)
        cfg = {"env": "android", "judge": {"judge": "env"},
               "android": {"devices": [{"server_url": p.url} for p in procs],
                           "options": {"settle_s": 0.0, "blank_wait_s": 0.05}}}
        cfg_path = out / "wire.json"
        cfg_path.write_text(json.dumps(cfg, indent=1))
        cmd += ["--config", str(cfg_path)]
    (out / kind).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    log = open(out / f"{kind}.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), procs


def finish(kind: str, out: Path, proc: subprocess.Popen, phones: list) -> None:
    try:
        rc = proc.wait()
    finally:
        for p in phones:
            p.close()
    if rc != 0:
        raise SystemExit(f"the {kind} run failed (exit {rc}); see {out}/{kind}.log")


def split(run_dir: Path) -> dict[str, float]:
    """Mean seconds per online iteration, by phase."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    its = [r["time_split"] for r in rows if r.get("stage") == "online" and "time_split" in r]
    keys = sorted({k for t in its for k in t})
    return {k: round(sum(t.get(k, 0.0) for t in its) / len(its), 2) for k in keys} if its else {}


def table(out: Path, kinds: list[str]) -> dict:
    result = {}
    print(f"{'':<10}" + "".join(f"{s:^24}" for s in STAGES) + "  wall (min)")
    for kind in kinds:
        f = out / kind / "summary.json"
        if not f.is_file():
            continue
        d = json.loads(f.read_text())
        cells = []
        for s in STAGES:
            r = d["stages"][s]
            lo, hi = r["ci95"]
            cells.append(f"{100 * r['success_rate']:5.1f}% [{100 * lo:4.1f},{100 * hi:5.1f}]"
                         f" {r['mean_length']:4.1f}")
        print(f"{kind:<10}" + "".join(f"{c:^24}" for c in cells) + f"  {d['wall_s'] / 60:6.1f}")
        result[kind] = {"stages": {s: d["stages"][s] for s in STAGES}, "wall_s": d["wall_s"],
                        "timings_s": d["timings_s"], "iteration_split_s": split(out / kind),
                        "unjudged_step_rate": d.get("unjudged_step_rate")}
    for kind, r in result.items():
        sp = r["iteration_split_s"]
        if sp:
            total = sum(sp.get(k, 0.0) for k in ("collect", "store", "critics", "filter",
                                                 "actor", "checkpoint"))
            env = sp.get("environments", 0.0)
            print(f"{kind}: online iteration {total:.1f} s, environments {env:.1f} s "
                  f"({100 * env / total:.0f}%), inference {sp.get('inference', 0.0):.1f} s, "
                  f"actor {sp.get('actor', 0.0):.1f} s")
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/wire_bench")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phones", type=int, default=16)
    ap.add_argument("--only", choices=["sim", "wire"], default=None)
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--parallel", action="store_true",
                    help="both runs at once, one CPU thread each (2-core machines)")
    ap.add_argument("--set", nargs="*", default=[], help="passed to the recipe (both runs)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    kinds = [a.only] if a.only else ["sim", "wire"]
    extra = ["--set", *a.set] if a.set else []
    if not a.table_only:
        if a.parallel:
            started = [(k, *start(k, out, a.seed, a.phones, extra, 1)) for k in kinds]
            for k, proc, phones in started:
                finish(k, out, proc, phones)
        else:
            for k in kinds:
                finish(k, out, *start(k, out, a.seed, a.phones, extra, None))
    result = table(out, ["sim", "wire"])
    res = ROOT / "benchmarks" / "results" / "bench_over_wire.json"
    res.write_text(json.dumps({"seed": a.seed, "phones": a.phones, "set": a.set,
                               "parallel": a.parallel, **result},
                              indent=1, default=float))
    print(f"wrote {res}")


if __name__ == "__main__":
    main(sys.argv[1:])
