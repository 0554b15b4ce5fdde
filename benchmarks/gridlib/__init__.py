"""A grid of runs, arms x seeds: each (arm, seed) one `recipes/offline_to_online.py` process,
several at a time, resumable, with one small result file per finished run and one table over
seeds (issue 16, item 3).

``python benchmarks/grid.py`` is its command line (:mod:`.cli`; examples there). The package,
by concern (issue 50): :mod:`.spec` (the grid spec and its jobs), :mod:`.provenance` (the code
each run ran on, the dirty-tree refusal, stale runs), :mod:`.results` (a run's result file,
written and read), :mod:`.runner` (running the jobs: locks, resume), :mod:`.stats` (intervals
and differences over seeds), :mod:`.tables` (table.md, table.json, curves.png) and
:mod:`.repo` (the checkout: its root, git). The names below are the ones other scripts and
the tests use; ``ROOT`` is not among them: every module reads ``repo.ROOT`` when it runs, so
that is where a test points the grid at another repository.

A grid is a JSON spec, ``benchmarks/grids/<grid>.json``::

    {"description": "...", "seeds": [0, 1, 2],
     "world": "webshop", "set": {"eval_every": 5},          # shared by every arm
     "arms": [{"name": "digirl", "from_grid": "table1_webshop"},   # that grid's arm and runs
              {"name": "critic_mse", "set": {"critic_loss": "mse"}},
              {"name": "awr", "set": {"algorithm": "awr"}}],
     "stages": ["copier", "offline", "online"], "reference": "digirl"}

An arm (and the shared part) may give ``world``, ``config`` (a JSON config file), ``set``
(config fields, merged over the shared ones), ``args`` (other recipe flags), ``recipe`` (default
recipes/offline_to_online.py). ``from_grid`` takes an arm, settings and runs, from another grid
(the same runs serve both tables). ``stages``: the table's rows per arm (every stage is in
table.json); ``reference``: the arm the others are compared with, seed by seed (default: the
first); ``pairs``: more differences, each ``[arm, its reference]`` (e.g. a noisy-judge arm
against its oracle-judged twin), and with two or more pairs the differences between them
(does one arm lose less than another?); ``curve_x``: curves.png's x, "online_trajectories"
(default) or "day" (the simulated phone's drift day); ``placeholder``: the grid is not ready
to run. Keys starting with "_" are comments.

Where things go (``<grid>`` of the arm: its ``from_grid``, else this grid):

    runs/grid/<grid>/<arm>/seed<S>/                  the run folder (--out of the recipe)
    runs/grid/<grid>/<arm>/seed<S>.log               its output, appended over attempts
    runs/grid/<grid>/<arm>/seed<S>.attempts.jsonl    each process's start and end
    benchmarks/results/grid/<grid>/<arm>-seed<S>.json  the result, written when the run ends
    benchmarks/results/grid/<grid>/table.md, table.json, curves.png

A job with a result file is done and skipped; one whose run wrote its summary gets its result
file; one whose run folder has a checkpoint is rerun with ``--resume``; a run folder without one
holds nothing to keep and is started afresh. So an interrupted grid goes on where it stopped,
here or (with the results committed) elsewhere. A job another live runner holds (its
``seed<S>.lock``) is left to it. Each job runs with ``OMP_NUM_THREADS = cpus // jobs``. The
table and the curves read only result files. ``--quick`` (a wiring check) puts runs and results
under runs/grid_quick/.

Provenance (issue 32, item 3). A run is not started on uncommitted changes to what it computes
with (the package, this runner, the grid spec(s), the recipe, a config file): the grid names
the files and stops, unless ``--allow-dirty``, which marks the run ``dirty`` with the sha256 of
the diff. Each process that works on a run (an attempt: the first, each resume) records when
it started and ended, its commit, the :func:`code_id` of the package and recipe there, dirty
or not, its threads and host; the result file carries them (``attempts``), its ``wall_s`` is
their sum, and a run picked up after it finished keeps the commits of the attempts that made
it. The table warns where a difference from the reference pairs runs on different code (the
code, not the commit: ``--commit`` adds a commit per result), and ``--rerun-stale COMMIT``
clears every run not on COMMIT's code, clean, before running what is missing.
"""

from .cli import main
from .provenance import (
    DirtyTreeError,
    code_id,
    is_stale,
    provenance,
    read_attempts,
    require_clean,
    run_versions,
    tree_state,
    version_label,
)
from .repo import GRIDS, RESULTS, RUNS
from .results import (
    FINAL,
    _diff_config,
    _stage_line,
    commit_files,
    load_results,
    result_record,
    with_final_stage,
    write_result,
)
from .runner import cpu_count, rerun_stale, run_jobs
from .spec import STAGES, Arm, GridSpec, Job, SpecError, jobs_of, load_spec, spec_path
from .stats import (
    mixed_commits,
    mixed_environments,
    mixed_threads,
    pair_differences,
    paired_difference,
    seed_contrast,
    split_stats,
    stage_stats,
)
from .tables import make_table, plot_curves, table_markdown, write_table

__all__ = [
    "FINAL", "GRIDS", "RESULTS", "RUNS", "STAGES", "Arm", "DirtyTreeError", "GridSpec", "Job",
    "SpecError", "_diff_config", "_stage_line", "code_id", "commit_files", "cpu_count",
    "is_stale", "jobs_of", "load_results", "load_spec", "main", "make_table", "mixed_commits",
    "mixed_environments", "mixed_threads", "pair_differences", "paired_difference",
    "plot_curves", "provenance",
    "read_attempts", "require_clean", "rerun_stale", "result_record", "run_jobs",
    "run_versions", "seed_contrast", "spec_path", "split_stats", "stage_stats",
    "table_markdown", "tree_state", "version_label", "with_final_stage", "write_result",
    "write_table",
]
