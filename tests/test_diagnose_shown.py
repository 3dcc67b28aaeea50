"""diagnose.triage reports each check's worst element in a tensor the user's code holds: the
operation's own output, or, for an operation torch runs inside one of its modules, the module
output (or input) it is a transpose or reshape of; an internal tensor is named as one.

Oracle: the user's own tensors, each module's output captured by a forward hook while triage
runs and each program's return value, indexed with the reported element, must hold the
values the check reports for the target and for the reference.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from precisionlab import diagnose

BF16 = torch.bfloat16
INTERNAL = "internal"


def cast(xs, dt):
    return tuple(x.to(dt) if x.is_floating_point() else x for x in xs)


class Seq(nn.Module):
    """The modules in turn; the extra inputs (a mask) go to the `Attention`."""

    def __init__(self, **mods):
        super().__init__()
        for k, m in mods.items():
            self.add_module(k, m)

    def forward(self, x, *rest):
        for m in self.children():
            if isinstance(m, Attention):
                x = m(x, *rest)
            else:
                x = m(x)
        return x


class Attention(nn.Module):
    """nn.MultiheadAttention as self-attention, with an attention mask; returns what it returns
    (the weights too when need_weights)."""

    def __init__(self, d, batch_first, need):
        super().__init__()
        self.mha = nn.MultiheadAttention(d, 2, batch_first=batch_first)
        self.need = need

    def forward(self, x, mask=None):
        y, w = self.mha(x, x, x, attn_mask=mask, need_weights=self.need)
        return y if w is None else (y, w)


def attention(batch_first, need, unbatched=False):
    """(model, inputs, expected rows) for nn.MultiheadAttention after a layer norm. The last
    token is zero and the queries at positions 0 and 1 attend to it alone; with the
    projections' biases zero, their outputs are exact zeros at the centre of their bounds
    (a score of 1, the most any element scores), so in the internal (L, N, E) output of
    F.multi_head_attention_forward the worst element has l >= 2: with N = 2 it does not
    index the module's batch-first (N, L, E) output unless it is transposed back."""
    torch.manual_seed(1)
    n, t, d = 2, 6, 8
    x = torch.randn(n, t, d) * 2
    x[:, t - 1] = 0
    mask = torch.zeros(t, t, dtype=torch.bool)  # True: not attended
    mask[:2, :t - 1] = True
    if unbatched:
        x = x[0]
    elif not batch_first:
        x = x.transpose(0, 1).contiguous()
    model = Seq(norm=nn.LayerNorm(d), att=Attention(d, batch_first, need)).eval()
    with torch.no_grad():
        model.att.mha.in_proj_bias.zero_()
        model.att.mha.out_proj.bias.zero_()
    k = "#0[0]" if need else "#0"
    rows = {"norm: layer_norm": ("norm", 0),
            "att.mha: multi_head_attention_forward" + k: ("att.mha", 0),
            "att.mha: zeros_like": INTERNAL, "att.mha: masked_fill_": INTERNAL}
    if need:
        rows["att.mha: multi_head_attention_forward#0[1]"] = ("att.mha", 1)
    if batch_first and not unbatched:  # the inputs' and the output's transposes
        rows["att.mha: transpose#0"] = ("norm", 0)
        rows["att.mha: transpose#1"] = ("att.mha", 0)
    return model, (x, mask), rows


def convolutions():
    torch.manual_seed(2)
    model = Seq(c2=nn.Conv2d(3, 4, 3, padding=1, stride=(2, 1)), flat=nn.Flatten(2),
                c1=nn.Conv1d(4, 5, 3, padding=1, padding_mode="reflect")).eval()
    return model, (torch.randn(2, 3, 6, 5),), {
        "c2: conv2d": ("c2", 0), "flat: flatten": ("flat", 0), "c1: pad": INTERNAL,
        "c1: conv1d": ("c1", 0)}


def linear_and_rows():
    """nn.Linear on a 3-D batch; softmax over a middle dimension; layer norm over two."""
    torch.manual_seed(3)
    model = Seq(lin=nn.Linear(5, 6), sm=nn.Softmax(dim=1), ln=nn.LayerNorm((4, 6)),
                lsm=nn.LogSoftmax(dim=0)).eval()
    return model, (torch.randn(3, 4, 5) * 3,), {
        "lin: linear": ("lin", 0), "sm: softmax": ("sm", 0), "ln: layer_norm": ("ln", 0),
        "lsm: log_softmax": ("lsm", 0)}


def functions():
    """Functions: their returns are what the user holds."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    a, b = torch.randn(3, 4, 5, generator=g), torch.randn(3, 5, 2, generator=g)

    def f(q, k, v, a, b):
        return (F.scaled_dot_product_attention(q, k, v), a @ b, torch.matmul(a, b),
                F.softmax(a, dim=1), F.log_softmax(a, dim=0), F.layer_norm(a, (4, 5)),
                torch.exp(a) * a, F.gelu(a), a.sum(dim=1), a.mean(dim=(0, 2)),
                torch.amax(a, dim=0))
    rows = {"scaled_dot_product_attention": ("return", 0), "matmul#0": ("return", 1),
            "matmul#1": ("return", 2), "softmax": ("return", 3), "log_softmax": ("return", 4),
            "layer_norm": ("return", 5), "mul": ("return", 6), "gelu": ("return", 7),
            "sum": ("return", 8), "mean": ("return", 9), "amax": ("return", 10)}
    return f, (q, k, v, a, b), rows


CASES = {
    "mha batch-first": lambda: attention(True, False),
    "mha batch-first, weights": lambda: attention(True, True),
    "mha sequence-first": lambda: attention(False, False),
    "mha sequence-first, weights": lambda: attention(False, True),
    "mha unbatched": lambda: attention(True, True, unbatched=True),
    "convolutions": convolutions,
    "linear and row-wise": linear_and_rows,
    "functions": functions,
}


def programs(model, hooks: bool):
    """(reference, target, captured): the float32 model and its bfloat16 copy, each on its
    inputs cast to its format; captured[name] fills with each module's outputs (forward hooks,
    hooks=True) and the program's return, as the last run computed them."""
    captured = {"reference": {}, "target": {}}

    def keep(store, key, out):
        out = out if isinstance(out, tuple) else (out,)
        store[key] = tuple(o for o in out if isinstance(o, torch.Tensor))

    def make(name, dt):
        store = captured[name]
        m = model if not isinstance(model, nn.Module) else copy.deepcopy(model).to(dt)
        if hooks and isinstance(m, nn.Module):
            for path, sub in m.named_modules():
                sub.register_forward_hook(lambda _m, _i, out, p=path: keep(store, p, out))

        def run(*a):
            out = m(*cast(a, dt))
            keep(store, "return", out)
            return out
        return run
    return make("reference", torch.float32), make("target", BF16), captured


def value(t: torch.Tensor, el) -> float:
    return float(t[el].float())


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("kind", list(CASES))
def test_reported_element_indexes_the_users_tensor(kind):
    model, inputs, rows = CASES[kind]()
    ref, tgt, captured = programs(model, hooks=True)
    rep = diagnose.triage(ref, tgt, inputs)
    assert rep.verdict == "Type-I" and not rep.unsound, rep.summary()
    found = [(c, k) for c in rep.checks for k in rows if c.op.startswith(k)]
    assert {k for _, k in found} == set(rows), (set(rows) - {k for _, k in found},
                                                [c.op for c in rep.checks])
    shown = [(c, rows[k]) for c, k in found if rows[k] != INTERNAL]
    for c, (key, k) in shown:  # the values the check reports, at its element of the tensor
        for name, want in (("target", c.target), ("reference", c.reference)):
            got = value(captured[name][key][k], c.element)  # IndexError: another layout
            assert same(got, want), (c.op, c.element, name, got, want)
    for c, (key, k) in shown:  # and the tensor named (its own output: no name)
        assert c.shape == tuple(captured["target"][key][k].shape), (c.op, c.shape)
        assert c.of == "" or f"module {key!r}" in c.of, (c.op, c.of)
    for c, k in found:
        if rows[k] == INTERNAL:  # a tensor the user never sees: said so, with its shape
            assert "an internal tensor of module" in c.of and len(c.shape) > 1, c
    # the same elements without the user's hooks (triage's own hooks are then global)
    ref2, tgt2, _ = programs(model, hooks=False)
    plain = diagnose.triage(ref2, tgt2, inputs)
    assert [(c.op, c.element, c.shape, c.of) for c in plain.checks] == [
        (c.op, c.element, c.shape, c.of) for c in rep.checks]


class _Untraced(TorchFunctionMode):
    """A mode that only calls through: nn.MultiheadAttention then takes the path triage sees,
    not its fused inference kernel."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_batch_first_attention_element_is_in_the_modules_layout():
    """The worst element of F.multi_head_attention_forward's internal (L, N, E) output has
    l >= N here (`attention`): reported as (n, l, e), it indexes the module's (N, L, E)
    output, which the element in the internal layout would not."""
    model, (x, mask), _ = attention(True, False)
    ref, tgt, _ = programs(model, hooks=False)
    rep = diagnose.triage(ref, tgt, (x, mask))
    att = next(c for c in rep.checks if "multi_head_attention_forward" in c.op)
    with torch.no_grad(), _Untraced():
        out = tgt(x, mask)
    assert att.shape == tuple(out.shape) == (2, 6, 8) and att.element[1] >= 2, att
    assert same(value(out, att.element), att.target)
    assert att.of == "the output of module 'att.mha' (MultiheadAttention)"


def test_summary_names_the_tensor_an_element_indexes():
    base = dict(index=3, op="m: pad#0", verdict="Type-II", outside=1, numel=10,
                element=(1, 2), margin=-1.0, width=0.5, lo=0.0, hi=0.5, reference=-1.0,
                target=0.25, self_outside=0)
    own = diagnose.OpCheck(**base, shape=(2, 5))
    inner = diagnose.OpCheck(**base, shape=(2, 7), of="an internal tensor of module 'm' "
                             "(Conv1d), which your code does not see")
    for c, text in ((own, "worst at (1, 2): reference -1 outside [0, 0.5]"),
                    (inner, "worst at (1, 2) of an internal tensor of module 'm' (Conv1d)")):
        rep = diagnose.TriageReport("Type-II", (c,), (), 4, 1, ())
        assert text in rep.summary().replace("\n    ", " "), rep.summary()
    assert "shape (2, 7)" in diagnose.TriageReport("Type-II", (inner,), (), 4, 1, ()).summary()
