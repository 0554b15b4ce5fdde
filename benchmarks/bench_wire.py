"""In process vs over the wire: ms per step of SimPhoneEnv against AndroidEnv driving a served
simulated phone (``digirl_lite.envs.sim.serve``, in its own process) through Appium's client.

    python benchmarks/bench_wire.py --episodes 10
    python benchmarks/bench_wire.py --episodes 10 --width 270 --height 570

Each episode is played in process first (the agents read the simulator's state), its action
strings kept, then replayed through ``AndroidEnv(settle_s=0)`` on the served phone seeded
alike, so both see the same screens (counted in ``screens_identical``). A wire step splits
into the gesture call (HTTP round trip and the phone's transition), the screenshot fetch
(HTTP, the phone's render and PNG encode when the screen is new, the transfer, JSON), the
client's decode (base64, PNG, RGB) and the rest (AndroidEnv's blank-screen check, the
prompt). The phone caches encodings per screen like the in-process render cache (same keys,
same size), so the encode cost per step is the cost of one encode times that cache's miss
rate. Surprises: the defaults with blank pages off (a loading page is near-white: AndroidEnv
would retry it and truncate; see serve.py). Prints a table and writes
benchmarks/results/bench_wire.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from digirl_lite.envs.android import AndroidConfig, AndroidEnv, AppiumDevice
from digirl_lite.envs.sim import Copier, ScriptedExpert, SimPhoneEnv, Surprises
from digirl_lite.envs.sim.serve import SET_TASK, encode_png, spawn_phones
from digirl_lite.judge.guards import is_blank

RESULTS = Path(__file__).resolve().parent / "results" / "bench_wire.json"
CAPS = {"platformName": "Android", "appium:automationName": "UiAutomator2"}


class TimedDevice(AppiumDevice):
    """An AppiumDevice that adds up the time of its gestures, fetches and decodes."""

    def __init__(self, config: AndroidConfig) -> None:
        super().__init__(config)
        self.seconds: dict[str, float] = defaultdict(float)

    def call(self, what: str, fn: Any) -> Any:
        t = time.perf_counter()
        try:
            return super().call(what, fn)
        finally:
            part = "fetch" if what == "screenshot" else what.split()[-1]  # "tap gesture"
            self.seconds[part] += time.perf_counter() - t

    def screenshot(self):
        t = time.perf_counter()
        fetched = self.seconds["fetch"]
        img = super().screenshot()
        self.seconds["decode"] += time.perf_counter() - t - (self.seconds["fetch"] - fetched)
        return img


def _digest(img) -> str:
    return hashlib.blake2b(img.tobytes(), digest_size=16).hexdigest()


def play_in_process(env: SimPhoneEnv, agent_name: str, episodes: int, seed: int):
    """Episodes in process: (task, seed, actions, screen digests) each, step times (s),
    and one image per distinct screen."""
    plays, step_s, screens = [], [], {}
    for i in range(episodes):
        agent = Copier(seed=i) if agent_name == "copier" else ScriptedExpert()
        ep_seed = seed * 100_000 + i
        # the task is named, not drawn: a draw would take a number from the seeded generator
        # that the served phone's setTask(task, seed) does not take
        obs, info = env.reset(env.tasks[i % len(env.tasks)], seed=ep_seed)
        actions, digests = [], []
        while True:
            text = agent.act(obs)
            t = time.perf_counter()
            obs, _, term, trunc, _ = env.step(text)
            step_s.append(time.perf_counter() - t)
            actions.append(text)
            digests.append(_digest(obs.screenshot))
            screens.setdefault(obs.screen_id, obs.screenshot)
            if term or trunc:
                break
        plays.append((info["task"], ep_seed, actions, digests))
    return plays, step_s, screens


def replay_over_the_wire(url: str, plays, horizon: int) -> tuple[dict[str, list[float]], int]:
    """The same actions through AndroidEnv: per-step seconds by part, and how many screens
    matched the in-process ones."""
    dev = TimedDevice(AndroidConfig(server_url=url, capabilities=CAPS, settle_s=0,
                                    blank_wait_s=0, connect_retries=0))
    env = AndroidEnv(dev.config, horizon=horizon, device=dev)
    parts: dict[str, list[float]] = defaultdict(list)
    identical = 0
    for task, ep_seed, actions, digests in plays:
        dev.driver.execute_script(SET_TASK, {"task": task, "seed": ep_seed})
        env.reset(task)
        for text, digest in zip(actions, digests):
            before = dict(dev.seconds)
            t = time.perf_counter()
            obs, *_ = env.step(text)
            total = time.perf_counter() - t
            spent = {k: dev.seconds[k] - before.get(k, 0.0) for k in ("gesture", "fetch",
                                                                       "decode")}
            for k, v in spent.items():
                parts[k].append(v)
            parts["other"].append(total - sum(spent.values()))
            parts["total"].append(total)
            identical += _digest(obs.screenshot) == digest
    env.close()
    return parts, identical


def _median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="webshop_test")
    ap.add_argument("--episodes", type=int, default=10, help="per agent")
    ap.add_argument("--agents", nargs="+", default=["copier", "expert"],
                    choices=["copier", "expert"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=1080)
    ap.add_argument("--height", type=int, default=2280)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    surprises = Surprises(blank=0.0)
    kw = {"surprises": surprises, "width": args.width, "height": args.height}
    (phone,) = spawn_phones(1, world=args.tasks, seed=args.seed, **kw)
    rows, screens_seen = [], {}
    try:
        for agent in args.agents:
            env = SimPhoneEnv(args.tasks, seed=args.seed, **kw)
            plays, step_s, screens = play_in_process(env, agent, args.episodes, args.seed)
            screens_seen.update(screens)
            r = env.renderer
            miss_rate = r.misses / max(1, r.hits + r.misses)
            parts, identical = replay_over_the_wire(phone.url, plays, env.horizon)
            ms = {k: float(np.mean(v)) * 1e3 for k, v in parts.items()}
            rows.append({
                "agent": agent, "episodes": args.episodes, "steps": len(step_s),
                "in_process_ms": round(float(np.mean(step_s)) * 1e3, 2),
                "in_process_ms_median": round(float(np.median(step_s)) * 1e3, 2),
                "wire_ms": round(ms["total"], 2),
                "wire_ms_median": round(float(np.median(parts["total"])) * 1e3, 2),
                **{f"wire_{k}_ms": round(ms[k], 2) for k in ("gesture", "fetch", "decode",
                                                             "other")},
                "screen_cache_miss_rate": round(miss_rate, 3),
                "screens_identical": f"{identical}/{len(step_s)}",
            })
        dev = AppiumDevice(AndroidConfig(server_url=phone.url, capabilities=CAPS))
        http_ms = _median_ms(lambda: dev.driver.get_window_rect(), 50)
        dev.quit()
    finally:
        phone.close()
    images = list(screens_seen.values())[:12]
    encode_ms = float(np.mean([_median_ms(lambda im=im: encode_png(im), 3) for im in images]))
    blank_ms = _median_ms(lambda: is_blank(images[0]), 20)
    out = {"tasks": args.tasks, "size": f"{args.width}x{args.height}", "surprises": "defaults, "
           "blank pages off", "rows": rows, "encode_ms_per_new_screen": round(encode_ms, 2),
           "http_round_trip_ms": round(http_ms, 2), "is_blank_ms": round(blank_ms, 2)}
    for row in rows:
        row["wire_encode_ms_amortized"] = round(encode_ms * row["screen_cache_miss_rate"], 2)

    head = ("agent", "steps", "in-proc", "wire", "gesture", "fetch", "decode", "other",
            "encode*", "same")
    print(" ".join(f"{h:>8}" for h in head))
    for r in rows:
        cells = (r["agent"], r["steps"], r["in_process_ms"], r["wire_ms"], r["wire_gesture_ms"],
                 r["wire_fetch_ms"], r["wire_decode_ms"], r["wire_other_ms"],
                 r["wire_encode_ms_amortized"], r["screens_identical"])
        print(" ".join(f"{c:>8}" for c in cells))
    print(f"ms per step (means); encode* = {encode_ms:.1f} ms per new screen x the screen "
          f"cache's miss rate (inside fetch); HTTP round trip {http_ms:.2f} ms; is_blank "
          f"{blank_ms:.1f} ms (inside other)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
