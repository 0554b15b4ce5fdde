"""What a run records of the libraries and CPU kernels its numbers depend on."""

from __future__ import annotations

import PIL
import torch

from digirl_lite.provenance import PACKAGES, environment


def test_environment_names_the_versions_and_kernels_in_use():
    env = environment()
    assert set(env["packages"]) == set(PACKAGES)
    assert env["packages"]["torch"] == torch.__version__
    assert env["packages"]["pillow"] == PIL.__version__
    assert env["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["python"].count(".") == 2 and env["cpu"]

