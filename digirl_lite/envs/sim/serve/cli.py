"""``python -m digirl_lite.envs.sim.serve``: serve one simulated phone from the command
line."""

from __future__ import annotations

import argparse
import json

from digirl_lite.envs.sim.serve.phone import CRASH_DOWN_S
from digirl_lite.envs.sim.serve.processes import URL_LINE
from digirl_lite.envs.sim.serve.server import MAX_BODY_BYTES, SimPhoneServer
from digirl_lite.envs.sim.world import HEIGHT, WIDTH

__all__ = ["main"]


def _json_arg(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object of field values")
    return value


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m digirl_lite.envs.sim.serve",
                                 description="Serve one simulated phone over the "
                                             "WebDriver / Appium protocol.")
    ap.add_argument("--port", type=int, default=4723, help="0: a free port (default: "
                    "Appium's 4723, where AndroidConfig looks by default)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--world", default="webshop",
                    help="task list setTask draws from: webshop, general, *_test, a file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--day", type=int, default=1, help="drift day")
    ap.add_argument("--surprises", type=_json_arg, help='e.g. {"popup": 0.5, "blank": 0}')
    ap.add_argument("--faults", type=_json_arg, help='e.g. {"crash": 0.01}')
    ap.add_argument("--crash-down-s", type=float, default=CRASH_DOWN_S)
    ap.add_argument("--width", type=int, default=WIDTH, help="screenshot width")
    ap.add_argument("--height", type=int, default=HEIGHT, help="screenshot height")
    ap.add_argument("--screen-cache", type=int, default=8)
    ap.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES,
                    help="largest request body read; a larger one is refused (413)")
    a = ap.parse_args(argv)
    server = SimPhoneServer(port=a.port, host=a.host, world=a.world, seed=a.seed, day=a.day,
                            surprises=a.surprises, faults=a.faults, crash_down_s=a.crash_down_s,
                            width=a.width, height=a.height, screen_cache=a.screen_cache,
                            max_body_bytes=a.max_body_bytes)
    print(f"{URL_LINE}{server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
