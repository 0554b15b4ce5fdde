"""The benchmarks: scripts run from the checkout (``python benchmarks/<x>.py``), and the grid's
package, :mod:`benchmarks.gridlib`, that ``benchmarks/grid.py`` and the tests import."""
