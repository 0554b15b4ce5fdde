"""Data-parallel training across processes (``accelerate launch``, torch.distributed).

With one process every function here is a no-op or the identity, so single-process runs
pay nothing. With N processes (gloo on CPU, NCCL on GPUs) the learner keeps one set of
weights everywhere:

* :func:`broadcast_parameters` copies process 0's weights to every process (after building
  or loading a model), as DDP does at wrap time;
* :func:`average_gradients` averages gradients across processes before each optimiser step
  (one flat all-reduce), so every process takes the same step;
* :func:`all_gather` exchanges Python objects (each process's collected episodes);
* :func:`weights_digest` names a set of weights, to check that processes agree.

Gathered objects travel by pickle between the run's own processes only; nothing read from
disk is unpickled.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["world_size", "rank", "broadcast_parameters", "average_gradients", "all_gather",
           "broadcast_object", "weights_digest"]


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def world_size() -> int:
    d = _dist()
    return d.get_world_size() if d else 1


def rank() -> int:
    d = _dist()
    return d.get_rank() if d else 0


def _tensors(modules: Iterable[torch.nn.Module]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for m in modules:
        out += [p.data for p in m.parameters()] + [b for b in m.buffers()]
    return out


def broadcast_parameters(*modules: torch.nn.Module) -> None:
    """Every process takes process 0's parameters and buffers."""
    d = _dist()
    if d is None or d.get_world_size() == 1:
        return
    with torch.no_grad():
        for t in _tensors(modules):
            d.broadcast(t, src=0)


def average_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Replace each gradient by its mean over processes (one flat all-reduce). A parameter
    without a gradient on this process counts as a zero gradient, so every process makes
    the same collective call whatever its data."""
    d = _dist()
    if d is None or d.get_world_size() == 1:
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    d.all_reduce(flat, op=d.ReduceOp.SUM)
    flat /= d.get_world_size()
    i = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[i:i + n].view_as(p).clone()
        i += n


def all_gather(obj: Any) -> list[Any]:
    """Every process's ``obj``, in process order (``[obj]`` with one process)."""
    d = _dist()
    if d is None or d.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * d.get_world_size()
    d.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    """Process 0's ``obj`` on every process."""
    d = _dist()
    if d is None or d.get_world_size() == 1:
        return obj
    box = [obj]
    d.broadcast_object_list(box, src=0)
    return box[0]


def weights_digest(*modules: torch.nn.Module) -> str:
    """A short name for the exact values of the modules' parameters and buffers."""
    h = hashlib.blake2b(digest_size=8)
    for t in _tensors(modules):
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()
