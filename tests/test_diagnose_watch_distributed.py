"""diagnose.watch under torch.distributed: two CPU processes with the gloo back end (one
torch.multiprocessing.spawn for both runs), a DDP run and an FSDP2 (fully_shard) run.
Statistics are reduced across the ranks (max of amax, sum of counts), parameter gradients are
taken on the reduced gradient (DDP: the all-reduced .grad, counted once; FSDP2: the shards,
summed), and the rank where the first NaN appeared is named on every rank."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _batch(rank: int, step: int, nan_rank: int, nan_step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 * rank + step)
    x = torch.randn(3, 4, generator=g) * (rank + 1)
    if (rank, step) == (nan_rank, nan_step):
        x[1, 2] = float("nan")
    return x


def _run(model, opt, rank, steps, nan_rank, nan_step, every=1):
    from precisionlab import diagnose

    first = _model()[0]  # the same initial weights on every rank
    with torch.no_grad():
        local0 = float(first(_batch(rank, 0, nan_rank, nan_step)).abs().max())
    with diagnose.watch(model, every=every, formats=("float16", "bfloat16"),
                        optimizer=opt) as w:
        for s in range(steps):
            opt.zero_grad()
            loss = model(_batch(rank, s, nan_rank, nan_step)).pow(2).mean()
            loss.backward()
            grads = {n: p.grad for n, p in model.named_parameters()}
            if s == 0:
                full = {n: g.full_tensor() if hasattr(g, "full_tensor") else g
                        for n, g in grads.items()}
                grad0 = {n.removeprefix("module."): float(g.abs().max())
                         for n, g in full.items()}
            opt.step()
            w.step(loss)
    r = w.report
    return {"local_amax0": local0, "grad_amax0": grad0,
            "records": [x.to_dict() for x in r.records if x.step == 0],
            "events": [e.to_dict() for e in r.events], "world": r.world_size}


def _worker(rank: int, init: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    results = {}
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(_model())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        results["ddp"] = _run(model, opt, rank, 3, nan_rank=1, nan_step=2)
        model = DDP(_model())  # step 2 without statistics: the guard's check, a replay
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        results["ddp_guard"] = _run(model, opt, rank, 3, nan_rank=1, nan_step=2, every=4)
        try:
            from torch.distributed.fsdp import fully_shard

            model = _model()
            fully_shard(model[0])
            fully_shard(model[2])
            fully_shard(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            results["fsdp"] = _run(model, opt, rank, 2, nan_rank=0, nan_step=1)
        except Exception as e:  # documented below: the exact error, and the test skips
            results["fsdp_error"] = f"{type(e).__name__}: {e}"
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("watch_dist")
    mp.spawn(_worker, (f"file://{d / 'init'}", str(d)), nprocs=WORLD, join=True)
    return [json.loads((d / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _stats(run, module, kind):
    return next(x for x in run["records"] if x["module"] == module and x["kind"] == kind)


def test_ddp_statistics_are_reduced_across_ranks(runs):
    ddp = [r["ddp"] for r in runs]
    assert all(r["world"] == WORLD for r in ddp)
    assert ddp[0]["records"] == ddp[1]["records"]  # every rank holds the reduced statistics
    act = _stats(ddp[0], "0", "activation")
    assert act["amax"] == max(r["local_amax0"] for r in ddp)  # max of the ranks' amax
    assert act["numel"] == WORLD * 3 * 8  # counts summed over the ranks
    grad = _stats(ddp[0], "0", "param grad")
    # on the all-reduced gradient (the same on every rank), counted once
    assert grad["numel"] == 4 * 8 + 8
    assert grad["amax"] == max(ddp[0]["grad_amax0"]["0.weight"], ddp[0]["grad_amax0"]["0.bias"])


def test_ddp_names_the_rank_of_the_first_nan(runs):
    for r in runs:
        (ev,) = r["ddp"]["events"]
        assert (ev["step"], ev["rank"], ev["phase"], ev["module"]) == (2, 1, "forward", "0")
        assert ev["mechanism"] == "nonfinite_input" and ev["op"] == "0: linear#0"


def test_ddp_names_the_first_nan_of_a_step_without_statistics_the_same(runs):
    for r in runs:
        assert r["ddp_guard"]["events"] == r["ddp"]["events"]  # replayed on rank 1 alone


def test_fsdp2_statistics_and_first_nan(runs):
    if "fsdp_error" in runs[0]:
        pytest.skip(f"FSDP2 on CPU/gloo in torch {torch.__version__}: {runs[0]['fsdp_error']}")
    fsdp = [r["fsdp"] for r in runs]
    assert fsdp[0]["records"] == fsdp[1]["records"]
    grad = _stats(fsdp[0], "0", "param grad")
    assert grad["numel"] == 4 * 8 + 8  # the shards' counts summed: the whole gradient
    assert grad["amax"] == max(fsdp[0]["grad_amax0"]["0.weight"],
                               fsdp[0]["grad_amax0"]["0.bias"])
    act = _stats(fsdp[0], "0", "activation")
    assert act["amax"] == max(r["local_amax0"] for r in fsdp)
    assert act["numel"] == WORLD * 3 * 8
    for r in fsdp:
        ev = r["events"][0]
        assert (ev["step"], ev["rank"], ev["phase"], ev["module"]) == (1, 0, "forward", "0")
        assert ev["mechanism"] == "nonfinite_input"
