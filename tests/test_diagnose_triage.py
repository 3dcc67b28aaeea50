"""diagnose.triage: identical programs are never Type-II, precision copies are round-off, and
planted bugs a few bound-widths wide are caught at the operation that makes them."""

import copy

import numpy as np
import pytest
import torch
from diagnose_models import MaskedEncoder, SmallCNN, encoder_batch

from precisionlab import diagnose, intervals


def _encoder(seed, mask="additive", dtype=torch.float32):
    torch.manual_seed(seed)
    return MaskedEncoder(mask=mask).eval().to(dtype)


@pytest.mark.parametrize("mask", ["additive", "inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_identical_programs_are_never_type_ii(mask, dtype):
    for seed in range(2):
        m = _encoder(seed, mask, dtype)
        batch = encoder_batch(seed)
        r = diagnose.triage(m, m, batch)
        assert r.verdict == "Type-I", r.summary()
        assert r.paired == len(r.checks) > 20 and not r.unsound


@pytest.mark.parametrize("mask", ["additive", "inf"])
def test_precision_copies_are_round_off(mask):
    m = _encoder(3, mask)
    batch = encoder_batch(3)
    low = copy.deepcopy(m).to(torch.bfloat16)  # weights rounded before anything is traced
    assert diagnose.triage(m, low, batch).verdict == "Type-I"

    def autocast(tokens, pad):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return m(tokens, pad)
    r = diagnose.triage(m, autocast, batch)
    assert r.verdict == "Type-I" and r.paired > 20 and not r.unsound
    # and the copies do differ from the reference by far more than float32 round-off
    with torch.no_grad():
        gap = (m(*batch) - low(*batch).float()).abs().max()
    assert gap > 1e-3


def test_any_summation_order_is_round_off():
    torch.manual_seed(0)
    lin = torch.nn.Linear(300, 4).eval()
    x = torch.randn(5, 300)

    def reversed_sum(z):  # the same products, summed in float32 from the last to the first
        prods = (z[:, None, :] * lin.weight[None, :, :]).flip(-1)
        return prods.cumsum(-1)[..., -1] + lin.bias
    r = diagnose.triage(reversed_sum, lin, x)
    assert r.verdict == "Type-I"
    with torch.no_grad():
        assert not torch.equal(reversed_sum(x), lin(x))  # the orders really differ


def test_planted_bug_of_a_few_bound_widths_is_caught():
    m = _encoder(4)
    batch = encoder_batch(4)
    clean = diagnose.triage(m, m, batch)
    head = [c for c in clean.checks if c.op.startswith("head: linear")][-1]
    width = head.width  # at the worst element of the final linear
    for factor, caught in ((3.0, True), (0.0, False)):
        bug = copy.deepcopy(m)
        delta = torch.zeros((*batch[0].shape, 23))
        delta[head.element] = factor * width
        bug.head.register_forward_hook(lambda _m, _i, out, d=delta: out + d)
        r = diagnose.triage(m, bug, batch)
        assert (r.verdict == "Type-II") == caught, r.summary()
        if caught:
            assert r.blamed.op.startswith("head: add") and r.blamed.outside == 1
            assert r.blamed.element == head.element
            assert r.blamed.widths_outside > 1


def test_planted_mask_and_scale_bugs_are_blamed():
    m = _encoder(5, "inf")
    tokens, pad = encoder_batch(5)
    wrong = pad.clone()
    wrong[1] = False  # the second row forgets its padding
    r = diagnose.triage(lambda t, p: m(t, pad), lambda t, p: m(t, wrong), (tokens, pad))
    # the masked_fill's mask differs from the reference's, so it is not paired (a correct
    # rewrite may mask in other steps): caught at the attention's output projection, with the
    # masked_fill named among the unchecked operations before it
    assert r.verdict == "Type-II" and r.blamed.op.startswith("layers.0.o: linear")
    assert any("masked_fill" in s and "bool argument" in s for s in r.suspects), r.suspects
    bad = copy.deepcopy(m)
    bad.layers[1].n1.eps = 1.0  # a normalisation with the wrong epsilon
    r = diagnose.triage(m, bad, (tokens, pad))
    assert r.verdict == "Type-II" and r.blamed.op.startswith("layers.1.n1: layer_norm")


def test_declared_kernel_tightens_the_bound():
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 3).eval()
    x = torch.randn(4, 256)
    loose = diagnose.triage(lin, lin, x)
    k = intervals.Kernel("blocked", acc="float32", block=16)
    tight = diagnose.triage(lin, lin, x, kernels={"linear": k})
    assert tight.verdict == loose.verdict == "Type-I"
    assert tight.checks[-1].width < loose.checks[-1].width
    assert tight.kernels and "blocked" in tight.kernels[0][1]


def test_unsupported_operations_raise_naming_them():
    torch.manual_seed(0)
    cnn = SmallCNN().eval()
    cnn.c2.register_forward_hook(lambda _m, _i, out: out.cumsum(-1))  # a scan: no rule
    with pytest.raises(diagnose.UnsupportedOperation, match="'cumsum' in module 'c2'"):
        diagnose.triage(cnn, cnn, torch.randn(1, 1, 4, 4))
    with pytest.raises(diagnose.UnsupportedOperation, match=r"dropout in training mode.*eval"):
        d = torch.nn.Dropout(0.5).train()
        diagnose.triage(d, d, torch.randn(3))
    with pytest.raises(ValueError, match="different shapes"):
        diagnose.triage(lambda x: x * 2, lambda x: x[:1] * 2, torch.randn(3))
    with pytest.raises(ValueError, match="target must be callable"):
        diagnose.triage(torch.sin, 3, torch.randn(3))


def test_report_displays_and_plots():
    m = _encoder(6)
    batch = encoder_batch(6)
    bug = copy.deepcopy(m)
    with torch.no_grad():
        bug.layers[0].f2.bias += 1.0
    r = diagnose.triage(m, bug, batch)
    assert r.verdict == "Type-II"
    assert all(len(line) <= 80 for line in str(r).splitlines()), str(r)
    import matplotlib

    matplotlib.use("Agg")
    assert r.plot() is not None
    assert np.isfinite(r.blamed.widths_outside)
    assert {"layer_norm", "conv2d", "multi_head_attention_forward"} <= set(diagnose.supported())
    assert "cumsum" not in diagnose.supported()


def test_recorded_values_survive_in_place_writes():
    """Outputs are recorded without a copy and cloned only before a write: the values a trace
    holds equal those of a trace that clones every output, for writes the tracing mode sees
    (add_, __setitem__), one it does not (out=, run again eagerly) and inference tensors."""
    from precisionlab.diagnose.triage import trace

    def seen(x):
        y = x * 2
        z = y + 1
        y.add_(5)
        z[0] = 0.0
        return y + z * 3

    def prog(x):
        w = seen(x)
        torch.mul(w, 2, out=w)
        return w + 1

    x = torch.randn(4, 3)
    with torch.inference_mode():
        xi = torch.randn(4, 3)
    for fn, inp, again in ((seen, x, False), (prog, x, True), (seen, xi, False)):
        lazy, eager = trace(fn, (inp,)), trace(fn, (inp,), eager=True)
        assert lazy.eager == again  # run again with clones only after an unseen write
        assert len(lazy.records) == len(eager.records) >= 6
        for a, b in zip(lazy.records, eager.records, strict=True):
            assert all(torch.equal(u, v) for u, v in zip(a.outs, b.outs, strict=True)), a.name
    y = x * 2
    assert torch.equal(trace(prog, (x,)).records[0].outs[0], y)  # before add_ wrote into it
    r = diagnose.triage(prog, prog, x)
    assert r.verdict == "Type-I" and not r.unsound


class _BucketBias(torch.nn.Module):
    """T5's relative attention bias in small: buckets from a log of the positions (integers
    computed from float values), a table looked up by them, added to the input."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(8, 1)
        self.register_buffer("one", torch.ones(()))  # not a wrapper of `table` (`_unwrapped`)

    def forward(self, x):
        pos = torch.arange(x.shape[-1])
        rel = (pos[None] - pos[:, None]).float().abs()
        bucket = (torch.log(rel + 1) * 3).to(torch.long).clamp(max=7)
        return x + self.table(bucket)[..., 0]


def test_a_scaled_table_looked_up_by_float_derived_buckets_is_type_ii():
    """The buckets are the reference's too (same_choice): the lookup is bounded by its rule, so a
    table scaled by 1 + 2^-6 is Type-II, blamed on the table (it was bounded by 'any row' and
    passed)."""
    torch.manual_seed(0)
    ref = _BucketBias()
    x = torch.randn(2, 6, 6)
    assert diagnose.triage(ref, ref, x).verdict == "Type-I"
    tgt = copy.deepcopy(ref)
    with torch.no_grad():
        tgt.table.weight.mul_(1 + 2**-6)
    r = diagnose.triage(ref, tgt, x)
    assert r.verdict == "Type-II"
    assert r.blamed.op.startswith("table: embedding")
    assert "embedding's weight" in r.culprit


def test_training_mode_running_statistics_are_restored():
    """triage runs each program (twice with the logic pass): batch norm's running statistics in
    training mode come back as they were."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    low = copy.deepcopy(m).to(torch.bfloat16)
    r = diagnose.triage(m, low, torch.randn(2, 3, 6, 6), cast_inputs=True)
    assert r.verdict == "Type-I"
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert int(low[1].num_batches_tracked) == 0
