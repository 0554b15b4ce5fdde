"""``python -m digirl_lite.envs.sim.serve``: see :mod:`digirl_lite.envs.sim.serve.cli`."""

from digirl_lite.envs.sim.serve.cli import main

if __name__ == "__main__":
    main()
