"""A grid of runs, arms x seeds (issue 16, item 3): the command line over the package
``benchmarks/gridlib/``, whose docstring says what a grid spec holds, where runs and results
go, and what each result records of the code it ran on.

    python benchmarks/grid.py table1_webshop              # run what is missing, then the table
    python benchmarks/grid.py table1_webshop --jobs 2 --commit   # commit each result as it lands
    python benchmarks/grid.py table1_webshop --table      # the table from the result files only
    python benchmarks/grid.py ablations_webshop --arms awr critic_mse --seeds 0 --dry-run
    python benchmarks/grid.py table1_webshop --quick --arms digirl --seeds 0   # wiring check
    python benchmarks/grid.py table1_webshop --rerun-stale HEAD   # rerun what is on other code
    python benchmarks/grid.py --list
"""

from __future__ import annotations

import sys
from pathlib import Path

# run as a script, sys.path[0] is benchmarks/: the checkout above it holds the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gridlib.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
