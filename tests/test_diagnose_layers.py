"""diagnose.triage on convolutions, multi-head attention and dropout, and the soundness of the
fast matrix-product bounds: every float32/bfloat16/float16 program's output, and a float64
program's, lies in the target's bound; planted bugs a few bound-widths wide are caught.

Oracles: torch executing the layers in each precision (and under CPU autocast), float64
programs, exact rational arithmetic (fractions) for the matrix products, the exact boxes
`leaf`/`_join`/`leaf_wide` build for the weights, hypothesis for random models and inputs.
"""

from __future__ import annotations

import copy
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from diagnose_models import SmallCNN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from precisionlab import diagnose
from precisionlab.diagnose.pairing import leaf_of
from precisionlab.intervals.torch_ops import arith as B
from precisionlab.intervals.torch_ops import layers as L
from precisionlab.intervals.torch_ops import products as P

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def derandomised(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def cast(xs, dt):
    return tuple(x.to(dt) if x.is_floating_point() else x for x in xs)


def round_off_only(model, inputs, targets=DTYPES, refs=(torch.float32, torch.float64),
                   autocast=True):
    """(target, reference, summary) for every pair whose triage is not Type-I with the target's
    own values inside its bounds (should be none)."""
    bad = []
    progs = {str(dt): (copy.deepcopy(model).to(dt), dt) for dt in set(targets) | set(refs)}

    def run(name):
        m, dt = progs[name]
        return lambda *a: m(*cast(a, dt))
    pairs = [(str(t), str(r)) for t in targets for r in refs]
    if autocast:
        def auto(*a):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(*a)
        pairs += [("autocast", str(r)) for r in refs]
    for t, r in pairs:
        rep = diagnose.triage(run(r), auto if t == "autocast" else run(t), inputs)
        own = sum(c.self_outside for c in rep.checks)
        if rep.verdict != "Type-I" or own or rep.unsound:
            bad.append((t, r, own, rep.summary()))
    return bad


# ----------------------------------------------------------------------------- convolutions


class ConvNet(nn.Module):
    """conv2d with padding, stride, dilation, groups, 'same' padding and no bias; conv1d."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, dilation=2, groups=4, padding="same")
        self.c3 = nn.Conv2d(8, 4, (2, 3), stride=(2, 1), bias=False)
        self.d1 = nn.Conv1d(4, 6, 5, padding=2)
        self.d2 = nn.Conv1d(6, 6, 3, stride=2, groups=2, padding_mode="reflect", padding=1)
        self.head = nn.Linear(6, 5)

    def forward(self, x):
        x = F.gelu(self.c1(x))
        x = F.silu(self.c2(x))
        x = self.c3(x).flatten(-2)  # (N, 4, H W)
        x = F.relu(self.d2(F.relu(self.d1(x))))
        return self.head(x.mean(-1))


def test_convolutions_are_round_off_in_every_precision():
    torch.manual_seed(0)
    net = ConvNet().eval()
    x = torch.randn(2, 3, 6, 7)
    # torch before 2.6 has no float16 reflection padding on the CPU ("reflection_pad1d" not
    # implemented for 'Half', measured on 2.3 to 2.5.1): the float16 copy cannot run there
    half_pads = torch.__version__ >= (2, 6)
    targets = DTYPES if half_pads else tuple(t for t in DTYPES if t != torch.float16)
    assert round_off_only(net, (x,), targets=targets) == []
    torch.manual_seed(1)
    assert round_off_only(SmallCNN().eval(), (torch.randn(3, 1, 8, 8) * 30,)) == []
    # unbatched input, and the bound is not vacuous: a few float32 ulps of the output
    rep = diagnose.triage(net, net, x[0])
    assert rep.verdict == "Type-I"
    conv = [c for c in rep.checks if "conv2d" in c.op]
    assert len(conv) == 3 and all(0 < c.width < 1e-4 for c in conv)


@pytest.mark.parametrize("factor,caught", [(3.0, True), (0.0, False)])
def test_planted_conv_bug_of_a_few_bound_widths(factor, caught):
    torch.manual_seed(2)
    net = ConvNet().eval()
    x = torch.randn(2, 3, 6, 7)
    clean = diagnose.triage(net, net, x)
    c2 = next(c for c in clean.checks if c.op.startswith("c2: conv2d"))
    bug = copy.deepcopy(net)
    delta = torch.zeros(2, 8, 6, 7)
    delta[c2.element] = factor * c2.width
    bug.c2.register_forward_hook(lambda _m, _i, out: out + delta)
    rep = diagnose.triage(net, bug, x)
    assert (rep.verdict == "Type-II") == caught, rep.summary()
    if caught:
        assert rep.blamed.op.startswith("c2: add") and rep.blamed.element == c2.element
        assert rep.blamed.outside == 1 and rep.blamed.widths_outside > 1


def test_tf32_convolution_operands_are_inside_the_tf32_bound_only():
    """cuDNN's float32 convolutions round their operands to TF32 when allow_tf32 is on (the
    default): conv_bound(tf32=True) holds the exact convolution of operands rounded to TF32 in
    any direction, which falls outside the float32 bound."""
    from precisionlab.rounding import round_to

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 7, 7, generator=g)
    w = torch.randn(6, 4, 3, 3, generator=g)
    b = torch.randn(6, generator=g)
    xi, wi, bi = (B.leaf(t) for t in (x, w, b))
    plain = L.conv_bound(xi, wi, bi, (1, 1), 1, (1, 1), 1, "float32", 2)
    tf32 = L.conv_bound(xi, wi, bi, (1, 1), 1, (1, 1), 1, "float32", 2, tf32=True)
    outside = 0
    for mode in ("nearest_away", "toward_zero", "up", "down"):
        xt, wt = (torch.from_numpy(np.asarray(round_to(t.numpy(), "tf32", mode))).double()
                  for t in (x, w))
        exact = F.conv2d(xt, wt, b.double(), padding=1).numpy()  # float64: within bounds
        assert ((tf32.lo <= exact) & (exact <= tf32.hi)).all(), mode
        outside += int(((exact < plain.lo) | (exact > plain.hi)).sum())
    assert outside > 0  # the TF32 term is needed


# ----------------------------------------------------------------------------- attention


class AttnBlock(nn.Module):
    """nn.MultiheadAttention between a layer norm and a linear head; returns the weights too.
    forward(x, *rest): rest holds the tensors named by `spec` (memory, pad, mask)."""

    def __init__(self, d=16, heads=4, kdim=None, batch_first=True, need_weights=False,
                 average=True, causal=False, spec=()):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mha = nn.MultiheadAttention(d, heads, kdim=kdim, vdim=kdim, batch_first=batch_first)
        self.head = nn.Linear(d, 7)
        self.need, self.average, self.causal, self.spec = need_weights, average, causal, spec

    def forward(self, x, *rest):
        kw = dict(zip(self.spec, rest, strict=True))
        q = self.norm(x)
        kv = kw.get("memory", q)
        y, w = self.mha(q, kv, kv, key_padding_mask=kw.get("pad"), attn_mask=kw.get("mask"),
                        is_causal=self.causal, need_weights=self.need,
                        average_attn_weights=self.average)
        out = self.head(x + y)
        return out if w is None else (out, w)


def attn_case(kind: str, need: bool, seed: int = 0):
    """(block, inputs) for one mask / layout case."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    b, t, d = 2, 5, 16
    x = torch.randn(b, t, d, generator=g) * 2
    pad = torch.tensor([[False] * t, [False] * 3 + [True] * (t - 3)])
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    if kind == "cross":  # keys of another length and width: separate projection weights
        blk = AttnBlock(d, kdim=12, need_weights=need, spec=("memory", "pad"))
        mem = torch.randn(b, 4, 12, generator=g)
        return blk.eval(), (x, mem, torch.tensor([[False] * 4, [False, True, True, True]]))
    if kind == "unbatched":
        return AttnBlock(d, need_weights=need).eval(), (x[0],)
    if kind == "seq_first":
        blk = AttnBlock(d, batch_first=False, need_weights=need, average=False, spec=("pad",))
        return blk.eval(), (x.transpose(0, 1), pad)
    masks = {"bool_pad": (pad,), "float_pad": (pad.float() * -1e4,),
             "inf_pad": (torch.zeros(b, t).masked_fill(pad, -math.inf),),
             "causal": (causal,),
             "bias": (torch.zeros(b, t).masked_fill(pad, -math.inf), torch.randn(t, t, generator=g))}
    spec = {"causal": ("mask",), "bias": ("pad", "mask")}.get(kind, ("pad",))
    blk = AttnBlock(d, need_weights=need, causal=kind == "causal", spec=spec)
    return blk.eval(), (x, *masks[kind])


KINDS = ("bool_pad", "float_pad", "inf_pad", "causal", "bias", "cross", "unbatched", "seq_first")


@pytest.mark.parametrize("need", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_multi_head_attention_is_round_off_in_every_precision(kind, need):
    blk, inputs = attn_case(kind, need)
    assert round_off_only(blk, inputs) == []
    rep = diagnose.triage(blk, blk, inputs)
    mha = [c for c in rep.checks if "multi_head_attention_forward" in c.op]
    assert len(mha) == (2 if need else 1), rep.summary()
    assert all(c.width < 1e-3 for c in mha), [c.width for c in mha]  # masks keep it tight


def test_sdpa_with_infinite_float_masks_is_tight_and_sound():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=g) for _ in range(3))
    mask = torch.zeros(2, 1, 6, 6).masked_fill(torch.rand(2, 1, 6, 6, generator=g) > 0.6, -math.inf)
    mask[..., 0] = 0.0  # no fully masked row

    def attn(a, b, c, m):
        return F.scaled_dot_product_attention(a, b, c, attn_mask=m.to(a.dtype))
    for t in DTYPES:
        for r in (t, torch.float64):
            rep = diagnose.triage(lambda *a, r=r: attn(*cast(a, r)),
                                  lambda *a, t=t: attn(*cast(a, t)), (q, k, v, mask))
            assert rep.verdict == "Type-I" and not rep.checks[-1].self_outside
            assert rep.checks[-1].width < (1e-4 if t == torch.float32 else 0.5)


@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])
def test_sdpa_rule_holds_for_each_cpu_kernel(backend):
    """The rule's CPU model (scores, softmax and the product with v in float32 for 16-bit
    inputs, from torch 2.5; in the dtype before) holds for torch's math and flash kernels, with
    bool, -inf and -1e4 masks and causal attention; and the math kernel does compute in float32
    from torch 2.5 and in bfloat16 on torch 2.3 and 2.4 (if torch changes that, the model must
    change too)."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 2, 9, 16, generator=g) * 4 for _ in range(3))
    keep = torch.rand(2, 1, 9, 9, generator=g) > 0.3
    keep[..., 0] = True
    masks = [None, keep, torch.zeros(2, 1, 9, 9).masked_fill(~keep, -math.inf),
             (~keep).float() * -1e4]
    for mask, causal in [(m, False) for m in masks] + [(None, True)]:
        def attn(a, b, c, m=mask, causal=causal):
            m = m if m is None or m.dtype == torch.bool else m.to(a.dtype)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(a, b, c, attn_mask=m, is_causal=causal)
        for t in DTYPES:
            for r in (t, torch.float64):
                rep = diagnose.triage(lambda *a, r=r: attn(*cast(a, r)),
                                      lambda *a, t=t: attn(*cast(a, t)), (q, k, v))
                assert rep.verdict == "Type-I" and not rep.checks[-1].self_outside, (t, r)
    if backend == SDPBackend.MATH:
        qb, kb, vb = (z.bfloat16() for z in (q, k, v))
        with sdpa_kernel(backend):
            y = F.scaled_dot_product_attention(qb, kb, vb)
        c = 16 ** -0.25
        if (2, 5) <= torch.__version__ < (2, 16):  # measured: torch 2.5 to 2.15, in float32
            s = (qb.float() * c) @ (kb.float() * c).transpose(-1, -2)
            assert torch.equal(y, (torch.softmax(s, -1) @ vb.float()).bfloat16())
        elif torch.__version__ < (2, 5):  # measured: torch 2.3 and 2.4, in bfloat16
            assert torch.equal(y, torch.softmax((qb * c) @ (kb * c).transpose(-1, -2), -1) @ vb)


def test_sdpa_rule_follows_torchs_low_precision_math_switch():
    """torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True) makes the CPU math kernel
    compute in float16/bfloat16 (the switch is global, not CUDA-only): the rule must then drop
    its float32 model, or correct programs come out Type-II with their own values outside."""
    if not hasattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed"):
        pytest.skip(f"torch {torch.__version__} has no such switch (it came with 2.5)")
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g) * 4 for _ in range(3))

    def attn(a, b, c):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(a, b, c)
    was = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    try:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
        qb, kb, vb = (z.bfloat16() for z in (q, k, v))
        s = (qb.float() * 16 ** -0.25) @ (kb.float() * 16 ** -0.25).transpose(-1, -2)
        assert not torch.equal(attn(qb, kb, vb), (torch.softmax(s, -1) @ vb.float()).bfloat16())
        for t in (torch.bfloat16, torch.float16):
            for r in (t, torch.float64):
                rep = diagnose.triage(lambda *a, r=r: attn(*cast(a, r)),
                                      lambda *a, t=t: attn(*cast(a, t)), (q, k, v))
                assert rep.verdict == "Type-I" and not rep.checks[-1].self_outside, (t, r)
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(was)


def test_grouped_query_sdpa_is_repeated_heads_then_attention():
    """enable_gqa=True (transformers' sdpa for grouped-query attention) repeats each key and
    value head h_q / h_kv times (repeat_interleave): its bound holds torch's result in every
    precision and is about as wide as the repeated program's; a key head repeated the wrong way
    round (repeat, not repeat_interleave) is caught; heads that do not divide are refused."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, 6, 8, generator=g)
    k, v = (torch.randn(2, 2, 6, 8, generator=g) for _ in range(2))

    def gqa(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)

    def repeated(a, b, c):
        b, c = (z.repeat_interleave(2, dim=1) for z in (b, c))
        return F.scaled_dot_product_attention(a, b, c, is_causal=True)
    for t in DTYPES:
        for r in (t, torch.float64):
            rep = diagnose.triage(lambda *a, r=r: gqa(*cast(a, r)),
                                  lambda *a, t=t: gqa(*cast(a, t)), (q, k, v))
            assert rep.verdict == "Type-I" and not rep.checks[-1].self_outside, (t, r)
    one = diagnose.triage(gqa, gqa, (q, k, v)).checks[-1]
    two = diagnose.triage(repeated, repeated, (q, k, v)).checks[-1]
    # the leaves k, v are the reals that round to them; the repeated ones are points there
    assert 0 < two.width <= one.width < 2e-5

    def tiled(a, b, c):
        b, c = (z.repeat(1, 2, 1, 1) for z in (b, c))
        return F.scaled_dot_product_attention(a, b, c, is_causal=True)
    assert diagnose.triage(gqa, tiled, (q, k, v)).verdict == "Type-II"
    bad = B.mk(np.zeros((2, 3, 6, 8)), np.ones((2, 3, 6, 8)))  # torch refuses it too
    with pytest.raises(diagnose.UnsupportedOperation, match="h_kv dividing the query heads"):
        L.repeat_heads(bad, 4)


@pytest.mark.parametrize("factor,caught", [(3.0, True), (0.0, False)])
def test_planted_attention_bug_of_a_few_bound_widths(factor, caught):
    blk, inputs = attn_case("bool_pad", False, seed=4)
    clean = diagnose.triage(blk, blk, inputs)
    att = next(c for c in clean.checks if "multi_head_attention_forward" in c.op)
    # the element is in the batch-first layout of the module's output, not in the (L, N, E)
    # layout of the call inside it, whichever element is the worst on this CPU
    assert att.shape == (2, 5, 16) and att.of == "the output of module 'mha' (MultiheadAttention)"
    bug = copy.deepcopy(blk)
    delta = torch.zeros(att.shape)
    delta[att.element] = factor * att.width
    bug.mha.register_forward_hook(lambda _m, _i, out: (out[0] + delta, out[1]))
    rep = diagnose.triage(blk, bug, inputs)
    assert (rep.verdict == "Type-II") == caught, rep.summary()
    if caught:
        assert rep.blamed.op.startswith("mha: add") and rep.blamed.element == att.element


def test_planted_attention_mask_bug_is_caught():
    blk, (x, pad) = attn_case("bool_pad", True, seed=5)
    wrong = pad.clone()
    wrong[1] = False  # the second sequence forgets its padding
    rep = diagnose.triage(blk, lambda a, p: blk(a, wrong), (x, pad))
    assert rep.verdict == "Type-II" and "mha" in rep.blamed.op, rep.summary()
    # and the same block in bfloat16 with the right mask is round-off
    low = copy.deepcopy(blk).to(torch.bfloat16)
    rep = diagnose.triage(blk, lambda a, p: low(a.bfloat16(), p), (x, pad))
    assert rep.verdict == "Type-I"


# ----------------------------------------------------------------------------- dropout


def test_training_mode_dropout_is_refused_with_the_fix():
    x = torch.randn(2, 4, 5, 5)
    cases = [nn.Dropout(0.2).train(), nn.Dropout2d(0.2).train(), nn.AlphaDropout(0.2).train(),
             lambda z: F.alpha_dropout(z, 0.2, True)]
    _, inputs = attn_case("bool_pad", False)
    mha = nn.MultiheadAttention(16, 4, dropout=0.1, batch_first=True).train()
    for f in cases:
        with pytest.raises(diagnose.UnsupportedOperation, match=r"training mode.*model\.eval\(\)"):
            diagnose.triage(f, f, x)
    # sdpa drops whenever dropout_p > 0, in eval mode too: the fix names dropout_p
    def sdpa(z):
        return F.scaled_dot_product_attention(z, z, z, dropout_p=0.1)
    assert not torch.equal(sdpa(x), F.scaled_dot_product_attention(x, x, x))
    with pytest.raises(diagnose.UnsupportedOperation, match=r"eval mode too.*dropout_p=0"):
        diagnose.triage(sdpa, sdpa, x)
    # F.alpha_dropout's training flag defaults to False: the identity, not refused
    assert diagnose.triage(lambda z: F.alpha_dropout(z, 0.2), lambda z: F.alpha_dropout(z, 0.2),
                           x).verdict == "Type-I"
    with pytest.raises(diagnose.UnsupportedOperation, match="multi-head attention's dropout"):
        diagnose.triage(lambda z: mha(z, z, z)[0], lambda z: mha(z, z, z)[0], inputs[0])
    # in eval mode (or with p = 0) dropout is the identity and triage goes through
    for f in (nn.Dropout(0.2).eval(), nn.Dropout2d(0.0).train(), mha.eval()):
        g = f if not isinstance(f, nn.MultiheadAttention) else (lambda z: mha(z, z, z)[0])
        z = inputs[0] if isinstance(f, nn.MultiheadAttention) else x
        assert diagnose.triage(g, g, z).verdict == "Type-I"


# ----------------------------------------------------------------------------- soundness


@st.composite
def random_models(draw):
    """A small residual network of random layers, an input of random scale, a padding mask."""
    d = draw(st.sampled_from([8, 16]))
    t = draw(st.integers(2, 6))
    layers = draw(st.lists(st.sampled_from(["linear", "gelu", "silu", "relu", "norm", "mha",
                                            "conv", "softmax"]), min_size=2, max_size=5))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = 10.0 ** draw(st.integers(-2, 2))
    torch.manual_seed(seed)
    mods = nn.ModuleList()
    for name in layers:
        mods.append({"linear": lambda: nn.Linear(d, d), "gelu": nn.GELU, "silu": nn.SiLU,
                     "relu": nn.ReLU, "norm": lambda: nn.LayerNorm(d), "softmax":
                     lambda: nn.Softmax(-1),
                     "mha": lambda: nn.MultiheadAttention(d, 2, batch_first=True),
                     "conv": lambda: nn.Conv1d(d, d, 3, padding="same")}[name]())
    need = draw(st.booleans())

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.mods = mods

        def forward(self, x, pad):
            for m in self.mods:
                if isinstance(m, nn.MultiheadAttention):
                    x = x + m(x, x, x, key_padding_mask=pad, need_weights=need)[0]
                elif isinstance(m, nn.Conv1d):
                    x = m(x.transpose(1, 2)).transpose(1, 2)
                else:
                    x = m(x)
            return x
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, t, d, generator=g) * scale
    pad = torch.zeros(2, t, dtype=torch.bool)
    pad[1, t // 2 + 1:] = True
    return layers, Net().eval(), (x, pad)


@derandomised(25)
@given(case=random_models(), target=st.sampled_from(["float32", "bfloat16", "float16",
                                                     "autocast"]),
       ref=st.sampled_from(["float32", "float64"]))
def test_random_models_lie_in_their_bounds(case, target, ref):
    """The target's every traced value lies in its own bound, and the float32 or float64
    reference's in the target's bound, for random models, scales and precisions."""
    layers, net, inputs = case
    targets = () if target == "autocast" else (getattr(torch, target),)
    bad = round_off_only(net, inputs, targets, (getattr(torch, ref),),
                         autocast=target == "autocast")
    assert bad == [], layers


def _fraction_dot(a_row, b_col) -> Fraction:
    return sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a_row, b_col,
                                                                          strict=True)),
               Fraction(0))


@derandomised(60)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 40), wdt=st.sampled_from(DTYPES),
       odt=st.sampled_from((None, *DTYPES)), fmt=st.sampled_from(["float32", "bfloat16",
                                                                   "float16"]),
       mag=st.sampled_from([1e-40, 1e-6, 1.0, 1e4]))
def test_leaf_product_bound_contains_every_exact_product(seed, k, wdt, odt, fmt, mag):
    """For a weight Leaf (paired with another copy or not) and an interval input, the exact
    product of any corner of the boxes (fractions) lies in `_mm`'s bound; and each leaf's box
    lies within t +- (rho |t| + tau)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(3, k, generator=g) * mag).to(wdt)
    other = None if odt is None else w.to(odt) if odt != wdt else w.clone()
    if {wdt, odt} == {torch.float16, torch.bfloat16}:
        other = None  # neither format holds the other's values: triage never pairs them
    elif other is not None and odt != wdt and torch.equal(other.to(wdt), w):
        other = (torch.randn(3, k, generator=g) * mag).to(odt)  # the finer copy, rounding to w
        other = torch.where(other.to(wdt) == w, other, w.to(odt))
    leaf = leaf_of(w, other, {"bfloat16", "float16", "float32"} - {fmt})
    box = leaf.box()
    t = B._np(w)
    lim = leaf.rho * np.abs(t) + leaf.tau
    assert (np.abs(box.lo - t) <= lim).all() and (np.abs(box.hi - t) <= lim).all()
    x = torch.randn(4, k, generator=g).double()
    a = B.mk(x.numpy(), x.numpy() + np.abs(x.numpy()) * 2.0**-10)
    y = P.mm(a, leaf, None, fmt, b_t=True)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        wc = np.where(rng.random(t.shape) < 0.5, box.lo, box.hi)
        ac = np.where(rng.random(a.lo.shape) < 0.5, a.lo, a.hi)
        for i in range(4):
            for j in range(3):
                e = _fraction_dot(ac[i], wc[j])
                lo, hi = float(y.lo[i, j]), float(y.hi[i, j])
                assert lo == -math.inf or Fraction(lo) <= e, (i, j)
                assert hi == math.inf or e <= Fraction(hi), (i, j)
