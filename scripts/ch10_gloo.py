"""Chapter 10's live run: torch.distributed's gloo all-reduce of one global batch at W = 1, 2, 4.

Four CPU processes (gloo back end, file:// rendezvous in a temporary folder) hold a global
batch of per-example float32 gradients (stored in the .npz, so that replaying needs no random
generator). At each world size W (the first W processes, a subgroup; W = 4 is the world),
rank r sums its block of N / W consecutive examples in example order with the simulator's
sequential float32 sum (portable, one rounding per add), then calls dist.all_reduce on the
result. The bits every rank ends with are stored beside the simulator's prediction,
`gpu.collectives.data_parallel_sum(samples, W, "gloo")`. Run (from the repository root):

    python3 scripts/ch10_gloo.py        # writes data/ch10_gloo.json + .npz (about 30 s)

tests/test_gpu_collectives_stored.py checks the stored bits against the simulator without
spawning anything; tests/test_gpu_collectives_gloo.py spawns gloo itself.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from precisionlab.gpu import reduce_sum
from precisionlab.gpu.collectives import data_parallel_sum

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "ch10_gloo"
WORLDS = (1, 2, 4)
N, n, SEED = 32, 512, 10


def samples() -> np.ndarray:
    """(N, n) float32 per-example gradients over many binades, mixed signs."""
    rng = np.random.default_rng(SEED)
    mag = np.ldexp(1.0, rng.integers(-20, 4, (N, n)))
    return (rng.choice([-1.0, 1.0], (N, n)) * rng.uniform(1, 2, (N, n)) * mag).astype(np.float32)


def _worker(rank: int, path: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=4)
    groups = {w: dist.new_group(list(range(w))) for w in WORLDS if w < 4}
    groups[4] = None
    x = samples().astype(np.float64)
    for w in WORLDS:
        if rank < w:
            shard = x[rank * (N // w):(rank + 1) * (N // w)]
            local = np.asarray(reduce_sum(shard.T, "sequential", "float32"), dtype=np.float32)
            t = torch.from_numpy(local.copy())
            dist.all_reduce(t, group=groups[w])
            np.save(os.path.join(out, f"w{w}_r{rank}.npy"), t.numpy())
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(os.path.join(d, "init"), d), nprocs=4, join=True)
        got = {w: [np.load(os.path.join(d, f"w{w}_r{r}.npy")) for r in range(w)] for w in WORLDS}
    x = samples()
    arrays = {"samples": x}
    summary = {}
    for w in WORLDS:
        same_ranks = all(np.array_equal(g.view(np.uint32), got[w][0].view(np.uint32))
                         for g in got[w])
        sim = data_parallel_sum(x.astype(np.float64), w, "gloo").astype(np.float32)
        arrays[f"gloo_w{w}"] = got[w][0]
        summary[str(w)] = {
            "ranks_agree": bool(same_ranks),
            "equal_to_simulator": int((sim.view(np.uint32) == got[w][0].view(np.uint32)).sum()),
            "entries": n,
            "differ_from_w1": int((got[w][0] != arrays["gloo_w1"]).sum()),
        }
    np.savez_compressed(OUT.with_suffix(".npz"), **arrays)
    OUT.with_suffix(".json").write_text(json.dumps({
        "description": "gloo all-reduce of one global batch of per-example float32 gradients at "
                       "world sizes 1, 2, 4 beside gpu.collectives' gloo order; see "
                       "scripts/ch10_gloo.py",
        "command": "python3 scripts/ch10_gloo.py",
        "torch": torch.__version__,
        "examples": N, "entries": n, "seed": SEED,
        "worlds": summary,
    }, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1))
    return 0 if all(s["equal_to_simulator"] == n for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
