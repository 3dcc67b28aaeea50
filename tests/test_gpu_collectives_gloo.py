"""gpu.collectives' "gloo" order against the real engine: torch.distributed's gloo all-reduce
on CPU processes (one spawn of 4 processes: the world, W = 4, and subgroups of 2 and 3 ranks),
compared bit for bit with the simulator."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from precisionlab.gpu import allreduce  # noqa: E402

WORLDS = (2, 3, 4)
# (elements, dtype): small tensors (2W segments), and one over 8 MiB (more segments than 2W)
CASES = ((1, "float32"), (7, "float32"), (24, "float32"), (37, "float32"), (1000, "float32"),
         (37, "bfloat16"), (1000, "bfloat16"), (2_300_000, "float32"))


def row(n: int, seed: int, rank: int) -> np.ndarray:
    """Rank `rank`'s n float32 values where the order matters: large and tiny, mixed signs."""
    rng = np.random.default_rng([seed, rank])
    mag = np.ldexp(1.0, rng.integers(-26, 8, n))
    return (rng.choice([-1.0, 1.0], n) * rng.uniform(1, 2, n) * mag).astype(np.float32)


def parts(w: int, n: int, seed: int) -> np.ndarray:
    """(w, n): every rank's row."""
    return np.stack([row(n, seed, r) for r in range(w)])


def as_dtype(x: np.ndarray, dtype: str):
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.to(getattr(torch, dtype))


def _worker(rank: int, path: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=4)
    groups = {w: dist.new_group(list(range(w))) for w in WORLDS if w < 4}
    groups[4] = None
    for w in WORLDS:
        for k, (n, dtype) in enumerate(CASES):
            if rank >= w:
                continue
            t = as_dtype(row(n, 100 * w + k, rank), dtype)
            dist.all_reduce(t, group=groups[w])
            np.save(os.path.join(out, f"w{w}_c{k}_r{rank}.npy"), t.float().numpy())
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory):
    d = tmp_path_factory.mktemp("gloo")
    import torch.multiprocessing as mp
    mp.spawn(_worker, args=(str(d / "init"), str(d)), nprocs=4, join=True)
    return {(w, k, r): np.load(d / f"w{w}_c{k}_r{r}.npy")
            for w in WORLDS for k in range(len(CASES)) for r in range(w)}


@pytest.mark.parametrize("w", WORLDS)
def test_gloo_all_reduce_is_the_simulators_gloo_order(gloo_results, w):
    for k, (n, dtype) in enumerate(CASES):
        x = parts(w, n, seed=100 * w + k)
        got = [gloo_results[(w, k, r)] for r in range(w)]
        for g in got[1:]:  # every rank holds the same bits
            assert np.array_equal(g.view(np.uint32), got[0].view(np.uint32))
        want = allreduce(as_dtype(x, dtype).double().numpy(), "gloo", dtype)
        assert np.array_equal(got[0].astype(np.float64), want), (w, n, dtype)
        if w > 2 and n >= 1000:  # the values do separate the orders
            for other in ("sequential", "ring")[: w - 2]:
                alt = allreduce(as_dtype(x, dtype).double().numpy(), other, dtype)
                assert not np.array_equal(alt, want), (w, n, dtype, other)
