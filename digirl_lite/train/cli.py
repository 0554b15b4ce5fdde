"""The command line every recipe shares: preset, config file, field overrides, output folder.

    ap = run_parser("what this recipe does")
    args = ap.parse_args()
    cfg = config_from_args(args)
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from digirl_lite.train.config import ConfigError, load_config, sim_quick, sim_webshop

__all__ = ["run_parser", "config_from_args", "cache_dir_of", "print_table"]


def run_parser(description: str, out: str = "runs/webshop") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=out, help="the run folder")
    ap.add_argument("--quick", action="store_true", help="the few-minute smoke preset")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--world", choices=["webshop", "general"], default=None)
    ap.add_argument("--config", help="JSON file of DigiRLConfig fields (recipes/configs/)")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=JSON",
                    help='override fields, e.g. --set iterations=10 judge=\'{"judge": '
                         '"noisy_oracle"}\'')
    ap.add_argument("--cache-dir", default=None,
                    help="starting policy and pile cache (default: $DIGIRL_LITE_CACHE or "
                         "~/.cache/digirl_lite; '' to disable)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines or bars")
    return ap


def config_from_args(args: argparse.Namespace, **extra: Any):
    """The run's config: the preset (``--quick`` or the default simulated Web Shopping),
    then ``--config``, ``--world``/``--seed``, ``--set`` and ``extra``. Exits with the reason
    when the config cannot run (bad field, missing path)."""
    overrides: dict[str, Any] = {}
    for name in ("seed", "world"):
        if getattr(args, name, None) is not None:
            overrides[name] = getattr(args, name)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected FIELD=VALUE")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    overrides.update(extra)
    try:
        if args.config:
            return load_config(args.config, preset="sim_quick" if args.quick else None,
                               **overrides)
        cfg = (sim_quick if args.quick else sim_webshop)(**overrides)
        cfg.check_paths()
        return cfg
    except (ConfigError, TypeError, ValueError) as e:
        raise SystemExit(f"bad configuration: {e}") from None


def cache_dir_of(args: argparse.Namespace):
    """``Trainer(cache_dir=...)`` for ``--cache-dir``: the user's cache by default, None
    (no cache) for ''."""
    from digirl_lite.train.trainer import USER_CACHE

    return USER_CACHE if args.cache_dir is None else (args.cache_dir or None)


def print_table(results: dict[str, dict[str, Any]], eval_tasks: int) -> None:
    """Held-out success (mean episode length; share of steps whose action string did not
    parse) of each run's stages, one row per run."""
    print(f"\nheld-out success (mean episode length; invalid steps) on the first {eval_tasks} "
          "test tasks")
    print(f"{'':<12} {'copier':^22}  {'offline':^22}  {'online':^22}")
    for name, summary in results.items():
        cells = []
        for stage in ("copier", "offline", "online"):
            r = summary["stages"].get(stage)
            inv = r.get("invalid_step_rate", float("nan")) if r else float("nan")
            cells.append(f"{'-':^22}" if r is None else
                         f"{100 * r['success_rate']:5.1f}% ({r['mean_length']:4.1f}; "
                         f"{100 * inv:4.1f}% inv)")
        print(f"{name:<12} " + "  ".join(cells))
