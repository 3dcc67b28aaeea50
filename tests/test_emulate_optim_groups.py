"""emulate's optimizers add parameter groups and clear gradients as torch.optim.Optimizer does, without torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from precisionlab import emulate


def _pair(cls_em, cls_torch, groups_of, **kw):
    """The same parameter groups given to an emulate optimizer and to torch's."""
    return cls_em(groups_of(), **kw), cls_torch(groups_of(), **kw)


@pytest.mark.parametrize("make", [
    lambda: [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.zeros(3))],
    lambda: [{"params": [torch.nn.Parameter(torch.ones(2))]},
             {"params": torch.nn.Parameter(torch.ones(1)), "lr": 0.5, "momentum": 0.25}],
    lambda: (p for p in [torch.nn.Parameter(torch.ones(4))]),
])
def test_groups_match_torch_sgd(make):
    ours, theirs = _pair(emulate.SGD, torch.optim.SGD, make, lr=0.1, momentum=0.5)
    assert len(ours.param_groups) == len(theirs.param_groups)
    for a, b in zip(ours.param_groups, theirs.param_groups, strict=True):
        assert [p.shape for p in a["params"]] == [p.shape for p in b["params"]]
        assert (a["lr"], a["momentum"]) == (b["lr"], b["momentum"])
    assert [g["params"] for g in ours.state_dict()["param_groups"]] == [
        g["params"] for g in theirs.state_dict()["param_groups"]]


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_matches_torch(set_to_none):
    ps = [torch.nn.Parameter(torch.ones(3)) for _ in range(2)]
    qs = [torch.nn.Parameter(torch.ones(3)) for _ in range(2)]
    for p, q in zip(ps, qs, strict=True):
        (p * 2).sum().backward()
        (q * 2).sum().backward()
    ps[1].grad = ps[1].grad * torch.ones(3, requires_grad=True)  # a grad with a graph
    qs[1].grad = qs[1].grad * torch.ones(3, requires_grad=True)
    emulate.Adam(ps).zero_grad(set_to_none)
    torch.optim.Adam(qs).zero_grad(set_to_none)
    for p, q in zip(ps, qs, strict=True):
        assert (p.grad is None) == (q.grad is None)
        if q.grad is not None:
            assert torch.equal(p.grad, q.grad) and p.grad.requires_grad == q.grad.requires_grad
            assert p.grad.grad_fn is None and q.grad.grad_fn is None


def test_bad_groups_are_refused():
    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(TypeError, match="set"):
        emulate.SGD([{"params": {p}}], lr=0.1)
    with pytest.raises(TypeError, match="Tensors"):
        emulate.SGD([{"params": [1.0]}], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        emulate.SGD([p * 2], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        emulate.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="more than once"):
        emulate.Adam([p, p])
    with pytest.raises(ValueError, match="empty"):
        emulate.Adam([])


def test_training_steps_do_not_import_dynamo():
    # torch's add_param_group and zero_grad import torch._dynamo (about 1 s cold) on first use.
    code = ("import sys, torch\n"
            "from precisionlab import emulate\n"
            "p = torch.nn.Parameter(torch.ones(3))\n"
            "for opt in (emulate.Adam([p], lr=0.1), emulate.SGD([p], lr=0.1, momentum=0.9)):\n"
            "    for _ in range(2):\n"
            "        opt.zero_grad()\n"
            "        (p * p).sum().backward()\n"
            "        opt.step()\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_named_parameters_are_accepted_as_torch_accepts_them():
    model = torch.nn.Linear(3, 2)
    ours, theirs = emulate.Adam(model.named_parameters()), torch.optim.Adam(
        model.named_parameters())
    assert ours.param_groups[0]["param_names"] == theirs.param_groups[0]["param_names"] == [
        "weight", "bias"]
    assert [p is q for p, q in zip(ours.param_groups[0]["params"],
                                   theirs.param_groups[0]["params"], strict=True)] == [True] * 2
    sd_ours, sd_theirs = ours.state_dict(), theirs.state_dict()
    assert sd_ours["param_groups"][0]["param_names"] == sd_theirs["param_groups"][0]["param_names"]
    model(torch.ones(1, 3)).sum().backward()
    ours.step()  # a step runs on the named group
    with pytest.raises(ValueError, match="all tensors or all"):
        emulate.SGD([("w", model.weight), model.bias], lr=0.1)
    with pytest.raises(ValueError, match="named"):
        emulate.SGD([{"params": [("w", model.weight)]}, {"params": [model.bias]}], lr=0.1)
