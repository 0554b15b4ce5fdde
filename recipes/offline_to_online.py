"""The main job: DigiRL's offline phase on a stored pile, then online iterations, on the
built-in simulated phone with tiny CPU models (Web Shopping, H = 20, by default).

By default the paper's setting (``recipes/configs/main.json``: a starting policy trained on
an older phone practises on today's) on a small budget; ``--config`` for another
(``recipes/configs/``), ``--quick`` for a smoke run of the pipeline on the shipped world.

    python recipes/offline_to_online.py                       # the default run
    python recipes/offline_to_online.py --world general       # the General world
    python recipes/offline_to_online.py --quick --out runs/quick
    python recipes/offline_to_online.py --resume --out runs/webshop   # after a crash or kill
    python recipes/offline_to_online.py --filtered-bc         # Filtered BC alongside
    python recipes/offline_to_online.py --processes 1         # one process (default: 2 on 2+ CPUs)
    python recipes/offline_to_online.py --quick --print-config   # the effective config, as JSON

Writes to --out: metrics.jsonl, summary.json (held-out success and mean episode length of
each stage: copier, offline, online), learning_curve.png, store/ (every trajectory) and
checkpoints/. Prints the table at the end.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from digirl_lite.errors import FolderBusyError
from digirl_lite.train.cli import (
    add_processes_argument,
    cache_dir_of,
    config_from_args,
    config_json,
    default_processes,
    launch_processes,
    print_table,
    processes_of_run,
    run_parser,
    threads_per_process,
)
from digirl_lite.train.config import ConfigError, with_algorithm
from digirl_lite.train.trainer import RunStopped, Trainer

MAIN_CONFIG = Path(__file__).resolve().parent / "configs" / "main.json"


def main(argv: list[str] | None = None) -> dict:
    ap = run_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --out from wherever it stopped")
    ap.add_argument("--allow-config-change", action="store_true",
                    help="with --resume: go on under a config that differs from the run's")
    ap.add_argument("--filtered-bc", action="store_true",
                    help="also run Filtered BC on the same budget (in OUT/filtered_bc)")
    ap.add_argument("--print-config", action="store_true",
                    help="print the effective config (after --config, --quick, --world, "
                         "--seed, --set) as JSON and exit without building anything")
    add_processes_argument(ap)
    args = ap.parse_args(argv)
    # a config that cannot run fails here, before any launch
    cfg = config_from_args(args, default_config=MAIN_CONFIG)
    if args.print_config:
        print(config_json(cfg))
        return {}
    n, why = args.processes, ""
    if n is None:  # not given: as the run being resumed ran, else where 2 measured faster
        ran_on = processes_of_run(args.out) if args.resume else None
        n, why = ((ran_on, "as the run ran") if ran_on else
                  (default_processes(cfg, args), "faster than one on a CPU machine"))
    if n > 1 and "WORLD_SIZE" not in os.environ:
        given = sys.argv[1:] if argv is None else list(argv)
        if args.processes is None:  # chosen here: say so, and tell the group
            print(f"[digirl_lite] {n} data-parallel processes of {threads_per_process(n)} "
                  f"thread(s) each ({why}; --processes 1 for one)", flush=True)
            given += ["--processes", str(n)]
        code = launch_processes(n, __file__, given)
        if code:
            raise SystemExit(code)
        return {}
    runs = [(cfg.algorithm, cfg, Path(args.out))]
    if args.filtered_bc and cfg.algorithm != "filtered_bc":
        runs.append(("filtered_bc", with_algorithm(cfg, "filtered_bc"),
                     Path(args.out) / "filtered_bc"))
    results = {}
    for name, c, out in runs:
        try:  # devices are reached and encoder widths compared here, before any collection
            trainer = Trainer(c, out, cache_dir=cache_dir_of(args),
                              progress=not args.quiet)
        except FolderBusyError as e:  # another live process writes the folder
            raise SystemExit(f"not started: {e}") from None
        except ConfigError as e:
            raise SystemExit(f"bad configuration: {e}") from None
        try:
            results[name] = trainer.run(resume=args.resume,
                                        allow_config_change=args.allow_config_change)
        except RunStopped as e:
            raise SystemExit(f"run stopped: {e}") from None
        except FolderBusyError as e:
            raise SystemExit(f"not started: {e}") from None
        except ConfigError as e:
            raise SystemExit(f"cannot resume: {e}") from None
    if trainer.is_main:  # under `accelerate launch`, once
        print_table(results, cfg.eval_tasks)
        print(f"wall time: {sum(r['wall_s'] for r in results.values()):.0f} s; "
              f"run folder: {args.out}")
    if trainer.world_size > 1:  # leave the group together: a process that exits while the other
        # still holds gloo's connections can abort in C++ ("terminate called without an
        # active exception", seen on --resume of a finished 2-process run)
        trainer.accelerator.wait_for_everyone()
        trainer.accelerator.end_training()
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
