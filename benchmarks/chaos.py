"""Issue 29's chaos run: the main job over served phones with the paper's judge behind a
local OpenAI-protocol server, once without faults and once while a driver kills and
restarts phones, makes the judge drop, fail and delay requests and go down for a while,
and kills the trainer with SIGKILL at random moments (each followed by ``--resume``). Then
it checks, over every record rather than a sample:

* every evaluation task was judged exactly once or is listed as not evaluated;
* no trajectory was lost or duplicated: the chaos run's store holds the same trajectory
  ids, each once and with the same task, as the fault-free run of the same seed;
* no infrastructure fault or unjudged step was counted as the agent's failure (every
  episode in a rate has a verdict on every step and no infrastructure truncation; the
  rate is over those alone);
* held-out success of every stage is within the fault-free run's 95% interval;
* what the faults cost in wall time.

    python benchmarks/chaos.py --out benchmarks/results/chaos.json            # full size
    python benchmarks/chaos.py --quick --phones 4 --out /tmp/chaos_quick.json  # minutes

Full size is 16 phones and every kind of fault, over the main job at the size the
over-the-wire benchmark runs it (``benchmarks/bench_over_wire.py``: a pile of 128, 6 online
iterations, 48 held-out tasks, evaluated after each phase) on the asynchronous fleet, with
540 x 1140 screenshots: on this project's 2-CPU machine the main job's own size takes about
two hours a run over the wire (its first evaluation alone, 96 tasks, took 8 minutes at 2.5
steps a second), and the pixels are not what this benchmark tests. ``--set`` replaces the
defaults (``--set iterations=30 ...`` for the main job's own size).

The judge is :class:`~digirl_lite.envs.sim.judge_server.TruthJudgeServer` (its verdicts
are the phones' own checks, so the fault-free run is the environment's judge over the
paper judge's code path). Phones are ``python -m digirl_lite.envs.sim.serve`` processes;
a killed phone is restarted on its port. All faults are drawn from ``--seed``; every one is
listed with its time in the result file. ``--fault-free DIR`` reuses a fault-free run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from digirl_lite.envs.sim.judge_server import JudgeFaults, TruthJudgeServer  # noqa: E402
from digirl_lite.envs.sim.serve import spawn_phones  # noqa: E402

FULL_SIZE = ["fleet=async", "eval_every=0", "pile_size=128", "iterations=6", "eval_tasks=48"]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


class Fleet:
    """The served phones; phone ``i`` keeps its port (and seed) across restarts."""

    def __init__(self, n: int, seed: int, **kw: Any) -> None:
        self.seed, self.kw = seed, kw
        self.procs = spawn_phones(n, world="webshop", seed=seed, **kw)
        self.urls = [p.url for p in self.procs]
        self.ports = [int(u.rsplit(":", 1)[1]) for u in self.urls]
        self.lock = threading.Lock()

    def kill(self, i: int) -> None:
        with self.lock:
            self.procs[i].kill()

    def restart(self, i: int) -> None:
        with self.lock:
            self.procs[i].close()
            for attempt in range(10):  # the port may linger for a moment after a kill
                try:
                    self.procs[i] = spawn_phones(1, world="webshop", seed=self.seed + i,
                                                 ports=[self.ports[i]], **self.kw)[0]
                    return
                except RuntimeError:
                    time.sleep(1.0 + attempt)
            raise RuntimeError(f"phone {i} could not be restarted on port {self.ports[i]}")

    def alive(self, i: int) -> bool:
        return self.procs[i].alive

    def close(self) -> None:
        for p in self.procs:
            p.close()


def _screen(args: argparse.Namespace) -> dict[str, int]:
    """The served phones' screenshot size (gestures stay in the 1080 x 2280 space)."""
    return {k: v for k, v in (("width", args.screen_width), ("height", args.screen_height))
            if v}


def write_config(path: Path, urls: list[str], judge_url: str, judge_timeout_s: float) -> None:
    preset = json.loads((ROOT / "recipes" / "configs" / "served_phones.json").read_text())
    preset.pop("_comment", None)
    preset["android"]["devices"] = [{"server_url": u} for u in urls]
    preset["android"]["reset"] = "task"  # each episode seeded and its task set, as with
    # the environment's judge: the paper judge alone would not tell the phone its task
    preset["judge"] = {"judge": "paper", "backend": {
        "backend": "openai", "model": "truth", "base_url": judge_url + "/v1",
        "api_key_env": None, "timeout_s": judge_timeout_s}}
    path.write_text(json.dumps(preset, indent=1))


class Trainer:
    """The main job as a user runs it, in a process group of its own (killed whole)."""

    def __init__(self, config: Path, out: Path, seed: int, extra: list[str], log: Path) -> None:
        self.cmd = [sys.executable, str(ROOT / "recipes" / "offline_to_online.py"),
                    "--config", str(config), "--out", str(out), "--cache-dir", "",
                    "--seed", str(seed), *extra]
        self.out, self.log = out, log
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self._reader: threading.Thread | None = None

    def start(self, resume: bool) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.cmd + (["--resume"] if resume else []),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, start_new_session=True)
        proc = self.proc

        def read() -> None:
            with self.log.open("a") as f:
                f.write(f"=== {time.strftime('%H:%M:%S')} {' '.join(proc.args[1:])}\n")
                for line in proc.stdout:
                    self.lines.append(line)
                    f.write(line)
                    f.flush()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    def kill(self) -> None:
        """SIGKILL to the trainer's process group (its data-parallel workers too)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self) -> int:
        code = self.proc.wait()
        self._reader.join(timeout=10)
        return code


def run_fault_free(work: Path, args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    out = work / "fault_free"
    fleet = Fleet(args.phones, args.seed, **_screen(args))
    judge = TruthJudgeServer(fleet.urls, seed=args.seed).up()
    try:
        cfg = work / "fault_free.json"
        write_config(cfg, fleet.urls, judge.url, args.judge_timeout_s)
        t0 = time.monotonic()
        tr = Trainer(cfg, out, args.seed, extra, work / "fault_free.log")
        tr.start(resume=False)
        code = tr.wait()
        wall = time.monotonic() - t0
    finally:
        judge.down()
        fleet.close()
    if code:
        raise SystemExit(f"the fault-free run failed (exit {code}); see {work}/fault_free.log")
    return {"dir": str(out), "wall_s": round(wall, 1), "judge": dict(judge.counts)}


def run_chaos(work: Path, args: argparse.Namespace, extra: list[str],
              expected_s: float) -> dict[str, Any]:
    rng = random.Random(args.seed * 7 + 1)
    out = work / "chaos"
    fleet = Fleet(args.phones, args.seed, **_screen(args))
    faults = JudgeFaults(drop=args.judge_drop, error=args.judge_error, delay=args.judge_delay,
                         delay_s=args.judge_delay_s, latency_s=args.judge_latency_s)
    judge = TruthJudgeServer(fleet.urls, seed=args.seed, faults=faults).up()
    cfg = work / "chaos.json"
    write_config(cfg, fleet.urls, judge.url, args.judge_timeout_s)
    events: list[dict[str, Any]] = []
    t0 = time.monotonic()
    stop = threading.Event()

    def note(kind: str, **kw: Any) -> None:
        events.append({"t": round(time.monotonic() - t0, 1), "event": kind, **kw})
        print(f"[chaos {events[-1]['t']:7.1f} s] {kind} {kw or ''}", flush=True)

    def phones() -> None:  # a kill every phone_kill_every s on average, back after a while
        down: dict[int, float] = {}
        next_kill = rng.expovariate(1 / args.phone_kill_every)
        while not stop.wait(0.5):
            now = time.monotonic() - t0
            for i, back in list(down.items()):
                if now >= back:
                    fleet.restart(i)
                    del down[i]
                    note("phone_restarted", phone=i, url=fleet.urls[i])
            if now >= next_kill:
                up = [i for i in range(len(fleet.urls)) if i not in down]
                if len(up) > 1:
                    i = rng.choice(up)
                    fleet.kill(i)
                    down[i] = now + rng.uniform(*args.phone_down_s)
                    note("phone_killed", phone=i, url=fleet.urls[i],
                         back_in_s=round(down[i] - now, 1))
                next_kill = now + rng.expovariate(1 / args.phone_kill_every)
        for i in down:
            fleet.restart(i)

    def judge_outages() -> None:
        next_down = rng.expovariate(1 / args.judge_down_every)
        while not stop.wait(0.5):
            if time.monotonic() - t0 >= next_down:
                length = rng.uniform(*args.judge_down_s)
                judge.down()
                note("judge_down", seconds=round(length, 1))
                if stop.wait(length):
                    break
                judge.up()
                note("judge_up")
                next_down = time.monotonic() - t0 + rng.expovariate(1 / args.judge_down_every)
        judge.up()

    kill_at = sorted(rng.uniform(0.1, 0.9) * expected_s for _ in range(args.trainer_kills))
    note("plan", trainer_kills_at_s=[round(x, 1) for x in kill_at])
    drivers = [threading.Thread(target=f, daemon=True) for f in (phones, judge_outages)]
    for d in drivers:
        d.start()
    tr = Trainer(cfg, out, args.seed, extra, work / "chaos.log")
    attempts, code = 0, None
    try:
        resume = False
        while attempts < args.max_attempts:
            attempts += 1
            tr.start(resume=resume)
            resume = True
            while tr.proc.poll() is None:
                time.sleep(0.2)
                if kill_at and time.monotonic() - t0 >= kill_at[0]:
                    kill_at.pop(0)
                    tr.kill()
                    note("trainer_killed", attempt=attempts)
            code = tr.wait()
            if (out / "summary.json").is_file() and code == 0:
                break
            said = "".join(tr.lines[-5:]).strip().splitlines()
            last = said[-1] if said else ""
            if code != -signal.SIGKILL:
                note("trainer_exited", code=code, said=last[:300])
            time.sleep(args.restart_wait_s)  # what a user's supervisor would wait
    finally:
        stop.set()
        for d in drivers:
            d.join(timeout=120)
        wall = time.monotonic() - t0
        judge.down()
        fleet.close()
    lines = tr.lines
    return {"dir": str(out), "wall_s": round(wall, 1), "attempts": attempts, "exit_code": code,
            "events": events, "judge": dict(judge.counts),
            "quarantine_lines": [x.strip() for x in lines if "left the fleet" in x],
            "return_lines": [x.strip() for x in lines if "rejoined the fleet" in x],
            "stop_lines": [x.strip() for x in lines if x.startswith("run stopped")
                           or "bad configuration" in x]}


# -- the checks ----------------------------------------------------------------------------
def _trajs(store: Path) -> list:
    from digirl_lite.data.store import TrajectoryStore

    if not (store / "digirl_store.json").is_file():
        return []
    return TrajectoryStore.open(store).load(with_images=False)[0]


def check(free_dir: Path, chaos_dir: Path) -> dict[str, Any]:
    free = json.loads((free_dir / "summary.json").read_text())
    chaos = json.loads((chaos_dir / "summary.json").read_text())
    out: dict[str, Any] = {"stages": {}}
    ok = True
    for stage, fs in free["stages"].items():
        cs = chaos["stages"].get(stage)
        if cs is None:
            out["stages"][stage] = {"ok": False, "why": "the chaos run has no such stage"}
            ok = False
            continue
        trajs = _trajs(chaos_dir / "eval" / stage)
        ids = Counter(t.traj_id for t in trajs)
        n = fs["episodes"]
        expected = {f"eval-{stage}-{k:05d}" for k in range(n)}
        usable = [t for t in trajs if t.is_usable]
        listed = {x["traj_id"] for x in cs.get("not_evaluated", [])}
        once = set(ids) == expected and max(ids.values(), default=0) == 1
        accounted = (cs["judged_episodes"] + len(listed) == n
                     and listed == {t.traj_id for t in trajs if not t.is_usable})
        rate_ok = (len(usable) == cs["judged_episodes"]
                   and sum(t.is_success for t in usable) == cs["successes"])
        lo, hi = fs["ci95"]
        within = lo <= cs["success_rate"] <= hi
        row = {"fault_free": round(100 * fs["success_rate"], 1),
               "fault_free_ci95": [round(100 * lo, 1), round(100 * hi, 1)],
               "chaos": round(100 * cs["success_rate"], 1),
               "judged": f"{cs['judged_episodes']}/{n}", "listed": len(listed),
               "each_task_once": once, "judged_or_listed": accounted,
               "rate_over_judged_only": rate_ok, "within_interval": within}
        row["ok"] = once and accounted and rate_ok and within
        ok &= row["ok"]
        out["stages"][stage] = row
    f_trajs, c_trajs = _trajs(free_dir / "store"), _trajs(chaos_dir / "store")
    f_ids = {t.traj_id: t.task for t in f_trajs}
    c_count = Counter(t.traj_id for t in c_trajs)
    c_ids = {t.traj_id: t.task for t in c_trajs}
    lost = sorted(set(f_ids) - set(c_ids))
    extra = sorted(set(c_ids) - set(f_ids))
    dup = sorted(k for k, v in c_count.items() if v > 1)
    # the pile's tasks are drawn from the seed alone: each id has the same task in both
    # runs. An online iteration's are drawn from the learner's stream, whose use depends on
    # the data collected before (which differs between any two runs over the wire: the
    # asynchronous fleet batches inference as the phones answer), so its ids are compared,
    # and each iteration must hold all of its own, once
    other_task = sorted(k for k in set(f_ids) & set(c_ids)
                        if not k.startswith("online-") and f_ids[k] != c_ids[k])
    def per_iteration(ids) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in ids:
            if k.startswith("online-"):
                it = k.rsplit("-", 1)[0]
                out[it] = out.get(it, 0) + 1
        return dict(sorted(out.items()))

    online_ids = per_iteration(c_ids)
    infra = [t for t in c_trajs if t.is_infra_truncated]
    # a stored infrastructure truncation (its task out of attempts) or a trajectory with an
    # unjudged step is kept for the record and is not usable (``Trajectory.is_usable``): the
    # critics and the actor never see it as a failure; counted here
    out["store"] = {"fault_free": len(f_trajs), "chaos": len(c_trajs), "lost": lost,
                    "extra": extra, "duplicated": dup, "different_task": other_task,
                    "online_trajectories_per_iteration": online_ids,
                    "infra_truncated_stored": len(infra),
                    "unjudged_stored": sum(1 for t in c_trajs if t.num_unjudged)}
    store_ok = not (lost or extra or dup or other_task) and online_ids == per_iteration(f_ids)
    kept = sorted(p.name for p in (chaos_dir / "stopped").glob("*")) if (
        chaos_dir / "stopped").is_dir() else []
    out["stopped_phases_kept"] = kept
    out["ok"] = bool(ok and store_ok)
    out["fleet"] = {k: v for k, v in (chaos.get("fleet") or {}).items()
                    if k != "device_events"}
    out["device_events"] = (chaos.get("fleet") or {}).get("device_events", [])
    out["unjudged_step_rate"] = chaos.get("unjudged_step_rate")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phones", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="the main job's --quick size")
    ap.add_argument("--set", action="append", default=None,
                    help=f"fields passed to the main job (default: {' '.join(FULL_SIZE)})")
    ap.add_argument("--work", default=None, help="where the runs go (default: a new temp dir)")
    ap.add_argument("--fault-free", default=None, help="reuse this fault-free run folder")
    ap.add_argument("--fault-free-wall-s", type=float, default=None)
    ap.add_argument("--screen-width", type=int, default=540,
                    help="served phones' screenshot width (a device's: 1080)")
    ap.add_argument("--screen-height", type=int, default=1140)
    ap.add_argument("--phone-kill-every", type=float, default=60.0, help="mean seconds")
    ap.add_argument("--phone-down-s", type=float, nargs=2, default=(10.0, 120.0))
    ap.add_argument("--judge-drop", type=float, default=0.02)
    ap.add_argument("--judge-error", type=float, default=0.03)
    ap.add_argument("--judge-delay", type=float, default=0.02)
    ap.add_argument("--judge-delay-s", type=float, default=12.0,
                    help="past --judge-timeout-s: each delayed request times out")
    ap.add_argument("--judge-latency-s", type=float, default=0.05)
    ap.add_argument("--judge-timeout-s", type=float, default=10.0)
    ap.add_argument("--judge-down-every", type=float, default=300.0, help="mean seconds")
    ap.add_argument("--judge-down-s", type=float, nargs=2, default=(15.0, 40.0))
    ap.add_argument("--trainer-kills", type=int, default=2)
    ap.add_argument("--restart-wait-s", type=float, default=10.0)
    ap.add_argument("--max-attempts", type=int, default=12)
    ap.add_argument("--out", default=None)
    ap.add_argument("--check-only", default=None, metavar="RESULT",
                    help="run the checks again on the run folders a result file names")
    args = ap.parse_args(argv)
    import tempfile

    work = Path(args.work or tempfile.mkdtemp(prefix="chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    fields = args.set if args.set is not None else ([] if args.quick else FULL_SIZE)
    extra = (["--quick"] if args.quick else []) + (["--set", *fields] if fields else [])
    result: dict[str, Any] = {
        "command": "python benchmarks/chaos.py " + " ".join(argv if argv is not None
                                                            else sys.argv[1:]),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--", "digirl_lite", "recipes",
                           "benchmarks/chaos.py")),
        "machine": f"{os.cpu_count()} CPUs", "work": str(work), "phones": args.phones,
        "seed": args.seed, "main_job_args": extra,
        "faults_configured": {k: getattr(args, k) for k in (
            "phone_kill_every", "phone_down_s", "judge_drop", "judge_error", "judge_delay",
            "judge_delay_s", "judge_latency_s", "judge_timeout_s", "judge_down_every",
            "judge_down_s", "trainer_kills")},
    }
    if args.check_only:  # the checks again, on the runs a result file names
        result = json.loads(Path(args.check_only).read_text())
        result["checks"] = check(Path(result["fault_free"]["dir"]),
                                 Path(result["chaos"]["dir"]))
        result["figures"]["faults_survived"] = "all" if result["checks"]["ok"] else \
            "see checks"
        result["checked_by"] = _git("rev-parse", "--short", "HEAD")
        return _write(result, args.out)
    if args.fault_free:
        free = {"dir": args.fault_free, "wall_s": args.fault_free_wall_s}
    else:
        free = run_fault_free(work, args, extra)
    result["fault_free"] = free
    print(f"[chaos] fault-free run: {free}", flush=True)
    expected = free["wall_s"] or 1200.0
    chaos = run_chaos(work, args, extra, expected)
    result["chaos"] = {k: v for k, v in chaos.items() if k != "events"}
    kinds = Counter(e["event"] for e in chaos["events"])
    jc = chaos["judge"]
    result["faults_injected"] = {
        "phone_kills": kinds["phone_killed"], "phone_restarts": kinds["phone_restarted"],
        "judge_outages": kinds["judge_down"], "judge_dropped": jc.get("dropped", 0),
        "judge_errors": jc.get("errors", 0), "judge_delayed_past_timeout": jc.get("delayed", 0),
        "trainer_kills": kinds["trainer_killed"]}
    result["events"] = chaos["events"]
    if chaos["exit_code"] == 0 and (Path(chaos["dir"]) / "summary.json").is_file():
        result["checks"] = check(Path(free["dir"]), Path(chaos["dir"]))
        fleet = result["checks"]["fleet"]
        result["figures"] = {
            **result["faults_injected"],
            "faults_survived": "all" if result["checks"]["ok"] else "see checks",
            "run_stops_resumed": kinds["trainer_exited"],
            "tasks_requeued": fleet.get("requeued"),
            "of_which_unjudged": fleet.get("requeued_unjudged"),
            "devices_quarantined": fleet.get("quarantined"),
            "devices_returned": fleet.get("returned"),
            "quarantine_lines": len(chaos["quarantine_lines"]),
            "data_lost": len(result["checks"]["store"]["lost"]),
            "wall_s_fault_free": free["wall_s"], "wall_s_chaos": chaos["wall_s"],
            "wall_cost": (round(chaos["wall_s"] / free["wall_s"], 2)
                          if free["wall_s"] else None)}
    else:
        result["checks"] = {"ok": False, "why": f"the chaos run did not finish (exit "
                                                f"{chaos['exit_code']} after {chaos['attempts']}"
                                                " attempts)"}
    return _write(result, args.out)


def _write(result: dict[str, Any], out: str | None) -> dict[str, Any]:
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
