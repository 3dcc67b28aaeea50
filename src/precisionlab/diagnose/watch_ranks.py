"""The watch under torch.distributed: which rank this process is, and the step's events and
statistics reduced across the ranks (events gathered from every rank that has one; counts
summed, amax reduced by max; DDP's parameter-gradient counts reduced by max, since every rank
holds the same reduced .grad). One process: everything passes through unchanged."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["gather_events", "local_shard", "rank_and_world", "reduce_counts"]


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2's parameters and gradients), else t itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside an initialised group of several."""
    d = torch.distributed
    if d.is_available() and d.is_initialized() and d.get_world_size() > 1:
        return d.get_rank(), d.get_world_size()
    return 0, 1


def _collective_device() -> torch.device:
    """Where the group's collectives take tensors: the current CUDA device under NCCL."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_events(events: list, rank: int, world: int) -> list:
    """Every rank's events of the step, in rank order (one all_reduce when none has any)."""
    if world == 1:
        return events
    d = torch.distributed
    flags = torch.zeros(world, dtype=torch.int64, device=_collective_device())
    flags[rank] = 1 if events else 0
    d.all_reduce(flags)
    if not int(flags.sum()):
        return events
    gathered = [None] * world
    d.all_gather_object(gathered, events)
    return [e for part in gathered for e in part]


def reduce_counts(counts: np.ndarray, amaxes: np.ndarray, replicated_rows: list[int],
                  world: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts summed over the ranks, amaxes reduced by max); the `replicated_rows` (the same
    tensor on every rank: DDP's reduced parameter gradients) are reduced by max, not summed."""
    if world == 1:
        return counts, amaxes
    d = torch.distributed
    dev = _collective_device()
    c = torch.from_numpy(counts.copy()).to(dev)
    a = torch.from_numpy(amaxes.copy()).to(dev)
    d.all_reduce(c, op=d.ReduceOp.SUM)
    d.all_reduce(a, op=d.ReduceOp.MAX)
    summed, amax = c.cpu().numpy(), a.cpu().numpy()
    if replicated_rows:
        m = torch.from_numpy(counts[replicated_rows]).to(dev)
        d.all_reduce(m, op=d.ReduceOp.MAX)
        summed[replicated_rows] = m.cpu().numpy()
    return summed, amax
