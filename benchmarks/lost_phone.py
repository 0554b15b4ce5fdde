"""Issue 29's lost phone, repeated as the issue ran it: the quick job on four served phones
(``python -m digirl_lite.envs.sim.serve``, the ``served_phones.json`` preset with bare URLs),
one phone killed with SIGKILL a few seconds into the online phase. Prints the run's table,
the quarantine lines and the final evaluation's record; writes them as JSON with ``--out``.

    python benchmarks/lost_phone.py --out benchmarks/results/lost_phone.json

Before issue 29 this run exited 0 with the final evaluation at "online 100.0%": 15 of its 16
tasks were lost to the dead phone (it failed each reset at once and took the next task) and
the one judged task was the rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kill-after-s", type=float, default=5.0,
                    help="seconds into the online phase")
    ap.add_argument("--victim", type=int, default=1, help="which phone (0-3)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from digirl_lite.envs.sim.serve import spawn_phones

    phones = spawn_phones(4, world="webshop", seed=0)
    tmp = Path(tempfile.mkdtemp(prefix="lost_phone-"))
    preset = json.loads((ROOT / "recipes" / "configs" / "served_phones.json").read_text())
    preset["android"]["devices"] = [p.url for p in phones]  # bare URLs, as the run
    cfg = tmp / "served.json"
    cfg.write_text(json.dumps(preset))
    out = tmp / "run"
    cmd = [sys.executable, str(ROOT / "recipes" / "offline_to_online.py"), "--quick",
           "--config", str(cfg), "--out", str(out), "--cache-dir", ""]
    t0 = time.monotonic()
    killed_at = None
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
        lines: list[str] = []

        def read() -> None:
            for line in proc.stdout:
                lines.append(line)
                print(line, end="", flush=True)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        online_seen = None
        while proc.poll() is None:
            time.sleep(0.1)
            if online_seen is None and any("online phase:" in x for x in lines):
                online_seen = time.monotonic()
            if online_seen is not None and killed_at is None and \
                    time.monotonic() - online_seen >= args.kill_after_s:
                phones[args.victim].kill()
                killed_at = round(time.monotonic() - t0, 1)
                print(f"[lost_phone] killed phone {args.victim} ({phones[args.victim].url}) "
                      f"at {killed_at} s", flush=True)
        reader.join(timeout=10)
    finally:
        for p in phones:
            p.close()
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() \
        else {}
    online = summary.get("stages", {}).get("online", {})
    result = {
        "command": " ".join(cmd[1:]),
        "victim": phones[args.victim].url, "killed_at_s": killed_at,
        "exit_code": proc.returncode, "wall_s": round(time.monotonic() - t0, 1),
        "quarantine_lines": [x.strip() for x in lines if "left the fleet" in x],
        "reconnect_lines": sum("reconnecting" in x for x in lines),
        "table": [x.rstrip() for x in lines[next((i for i, x in enumerate(lines)
                                                   if x.startswith("held-out")), len(lines)):]
                  if x.strip()],
        "online": {k: online.get(k) for k in ("success_rate", "judged_episodes", "episodes",
                                              "complete", "not_evaluated", "failure_kinds")},
        "fleet": summary.get("fleet"),
    }
    print(json.dumps(result, indent=1, default=str))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


if __name__ == "__main__":
    main()
