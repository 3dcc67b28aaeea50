"""diagnose.triage's blame (diagnose/blame.py) and logic pass (diagnose/logic.py) on real models
with planted bugs: the whole chain of unchecked operations, a constant that differs shown with
both values and ranked first, a missing or extra operation named, and a bfloat16 model's logic
bug found by its float32 run. Models are built from small configs with seeded random weights
(no download): GPT-2 with eager attention, BERT, plain torch MLPs."""

from __future__ import annotations

import copy
import os
import types

import pytest
import torch
from torch import nn

from precisionlab import diagnose
from precisionlab.diagnose import blame

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

VOCAB = 100
SCALE = 8 ** -0.5  # GPT-2's attention scale for head_dim 8


def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB,
                                  n_positions=32, bos_token_id=0, eos_token_id=0,
                                  attn_implementation="eager")
    return transformers.GPT2LMHeadModel(cfg).eval()


def bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=VOCAB, num_labels=3,
                                  max_position_embeddings=32)
    return transformers.BertForSequenceClassification(cfg).eval()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


def batch():
    """A tokenizer's output: two sequences of 8, the second padded after 5 tokens."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 8), generator=g)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    ids[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def scale_bug(m, factor=1 + 2**-7):
    """GPT-2's eager attention with its scale off by factor in layer 0 (the target copy only:
    GPT2Attention.scaling is what it passes to eager_attention_forward)."""
    t = copy.deepcopy(m)
    t.transformer.h[0].attn.scaling *= factor
    return t


def no_residual(m):
    """Layer 0 of GPT-2 without its attention's residual add."""
    t = copy.deepcopy(m)
    blk = t.transformer.h[0]

    def forward(self, hidden_states, cache=None, attention_mask=None, *_args, **kw):
        kw.pop("encoder_attention_mask", None)
        a, _ = self.attn(self.ln_1(hidden_states), cache=cache, attention_mask=attention_mask,
                         **kw)
        return a + self.mlp(self.ln_2(a))  # the reference: h = a + hidden_states first
    blk.forward = types.MethodType(forward, blk)
    return t


def lines_fit(r):
    return all(len(line) <= 80 for line in str(r).splitlines())


def test_attention_scale_bug_is_blamed_on_the_scale_with_both_values():
    m = gpt2()
    r = diagnose.triage(m, scale_bug(m), batch())
    assert r.verdict == "Type-II"
    assert r.blamed.op == "transformer.h.0.attn.c_proj: view#1"
    # the whole chain back to the last checked values, not six: the mul is eleven back
    assert len(r.suspects) > 6
    assert r.suspects[0].startswith("#24 transformer.h.0.attn: mul#0 (differs")
    assert all(s.split(" ")[0] < "#35" for s in r.suspects)
    assert r.culprit.startswith("#24 transformer.h.0.attn: mul#0: mul's scalar: reference "
                                f"{SCALE:.8g}, target {SCALE * (1 + 2**-7):.8g}"), r.culprit
    text = r.summary()
    assert "likely cause: #24 transformer.h.0.attn: mul#0" in text and lines_fit(r)
    assert r.differences == ()  # the same operations, one constant differs


def test_dropped_residual_is_named_as_a_missing_add():
    m = gpt2()
    r = diagnose.triage(m, no_residual(m), batch())
    assert r.verdict == "Type-II" and r.blamed.op.startswith("transformer.h.0.ln_2")
    assert len(r.differences) == 1
    d = r.differences[0]
    assert d.startswith("module 'transformer.h.0': the target runs no `add` after module "
                        "'transformer.h.0.attn' (the reference's #"), d
    assert "transformer.h.0: add#0)" in d and "47 operations there, the reference 48" in d
    assert r.culprit == d  # the missing add sits just before the blamed layer norm
    assert "likely cause: module 'transformer.h.0'" in r.summary() and lines_fit(r)


def test_extra_operation_and_changed_leaves_are_named():
    m = mlp()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    r = diagnose.triage(m, lambda z: m(z) * 1.01, x)
    assert r.verdict == "Type-II" and r.blamed.op == "mul#0"
    assert r.culprit.startswith("the top level: the target runs an extra `mul` after module "
                                "'2' (#3)"), r.culprit
    bug = copy.deepcopy(m)
    with torch.no_grad():
        bug[0].bias.mul_(1 + 2**-7)
    r = diagnose.triage(m, bug, x)
    assert r.verdict == "Type-II" and r.blamed.op == "0: linear#0"
    assert r.culprit.startswith("#0 0: linear#0: linear's bias (float32, shape (16,)): 16 of "
                                "16 entries differ"), r.culprit
    assert "(relative 0.0078)" in r.culprit


def test_layer_norm_eps_is_shown_with_both_values():
    m = bert()
    path = "bert.encoder.layer.0.attention.output.LayerNorm"
    e = copy.deepcopy(m)
    e.get_submodule(path).eps = 1e-2
    r = diagnose.triage(m, e, batch())
    assert r.verdict == "Type-II" and r.blamed.op.startswith(path)
    assert r.culprit.endswith("layer_norm's eps: reference 1e-12, target 0.01"), r.culprit


@pytest.mark.parametrize("build", [gpt2, bert, mlp])
def test_identical_programs_and_bfloat16_copies_are_never_type_ii(build):
    m = build()
    b = batch() if build is not mlp else torch.randn(3, 8)
    r = diagnose.triage(m, m, b)
    assert r.verdict == "Type-I" and r.differences == () and r.culprit == "" and not r.suspects
    assert r.logic is None and r.logic_note == ""  # a float32 target: nothing to cast up
    low = copy.deepcopy(m).to(torch.bfloat16)
    r = diagnose.triage(m, low, b, cast_inputs=True)  # the MLP's target gets bfloat16 inputs
    assert r.verdict == "Type-I", r.summary()
    assert r.logic is not None and r.logic.verdict == "Type-I", r.logic.summary()
    assert lines_fit(r)


def test_counts_are_consistent():
    m = gpt2()
    r = diagnose.triage(m, m, batch(), logic_pass=False)
    assert r.paired == len({c.index for c in r.checks}) <= r.operations
    assert len(r.checks) > r.paired  # split: one check per output
    first = r.summary().split("\n")[0] + r.summary().split("\n")[1]
    assert f"{r.operations} target operations traced, {r.paired} of them checked" in first
    assert f"({len(r.checks)} outputs)" in first


def test_logic_pass_finds_a_bfloat16_models_logic_bug():
    m = gpt2()
    low = copy.deepcopy(m).to(torch.bfloat16)
    r = diagnose.triage(m, scale_bug(low), batch())
    assert r.verdict == "Type-I"  # the scale bug hides inside bfloat16's bounds ...
    lg = r.logic  # ... and the float32 run of the same program finds it
    assert lg is not None and lg.verdict == "Type-II"
    assert lg.culprit.startswith("#24 transformer.h.0.attn: mul#0: mul's scalar"), lg.culprit
    assert "the program's logic differs from the reference's" in r.summary() and lines_fit(r)
    # a Type-II first pass runs it only when asked
    bad = no_residual(low)
    assert diagnose.triage(m, bad, batch()).logic is None
    r = diagnose.triage(m, bad, batch(), logic_pass=True)
    assert r.verdict == r.logic.verdict == "Type-II" and r.logic.culprit == r.culprit
    assert diagnose.triage(m, low, batch(), logic_pass=False).logic is None


def test_logic_pass_says_when_it_is_not_possible():
    m = mlp()
    low = copy.deepcopy(m).to(torch.bfloat16)
    x = torch.randn(3, 8)
    fn = lambda z: low(z.to(torch.bfloat16))  # noqa: E731
    r = diagnose.triage(m, fn, x)
    assert r.logic is None and r.logic_note == ""  # automatic: silent
    r = diagnose.triage(m, fn, x, logic_pass=True)
    assert r.logic is None and "not an nn.Module" in r.logic_note
    assert "logic pass not run: the target is a function" in r.summary()
    r = diagnose.triage(m, m, x, logic_pass=True)
    assert "they are float32" in r.logic_note
    r = diagnose.triage(lambda z: m(z), low, x, logic_pass=True, cast_inputs=True)
    assert "the reference is a function" in r.logic_note
    with pytest.raises(ValueError, match=r"logic_pass must be True, False or None.*'yes'"):
        diagnose.triage(m, m, x, logic_pass="yes")


def test_logic_pass_rounds_only_what_the_target_holds_low():
    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("shift", torch.full((4,), 1 / 3))

        def forward(self, x):
            return self.lin(x) + self.shift.to(x.dtype)

    torch.manual_seed(0)
    m = WithBuffer().eval()
    low = copy.deepcopy(m)
    low.lin.to(torch.bfloat16)  # the parameters only: the buffer stays float32
    r = diagnose.triage(m, low, torch.randn(2, 4), logic_pass=True, cast_inputs=True)
    assert r.logic is not None and r.logic.verdict == "Type-I", r.logic.summary()


def test_argument_differences_name_parameters():
    x = torch.randn(2, 4)
    w = torch.ones(4)
    tr = diagnose.triage  # the records come from traces of the two calls
    from precisionlab.diagnose.triage import trace

    a = trace(lambda z: torch.nn.functional.layer_norm(z, (4,), w, None, 1e-5), (x,))
    b = trace(lambda z: torch.nn.functional.layer_norm(z, (4,), w, None, eps=1e-3), (x,))
    got = blame.argument_differences(b.records[0], a.records[0])
    assert got == ["layer_norm's eps: reference 1e-05, target 0.001"]
    a = trace(lambda z: z.softmax(-1), (x,))
    b = trace(lambda z: z.softmax(-2), (x,))
    assert blame.argument_differences(b.records[0], a.records[0]) == [
        "softmax's dim: reference -1, target -2"]
    assert tr(lambda z: z.softmax(-1), lambda z: z.softmax(-1), (x,)).verdict == "Type-I"


def test_a_recurrent_layer_bug_names_the_parameter_not_the_initial_state():
    """torch.lstm takes hx and its weights as lists: each element is compared as a tensor, so
    the culprit names params[k] (the scaled weight) and not hx (equal zeros, other objects)."""
    torch.manual_seed(0)
    ref = nn.LSTM(4, 3, num_layers=2, batch_first=True).eval()
    tgt = copy.deepcopy(ref)
    with torch.no_grad():
        tgt.weight_hh_l1.mul_(1 + 2**-6)
    x = torch.randn(2, 5, 4)
    r = diagnose.triage(lambda z: ref(z)[0], lambda z: tgt(z)[0], x)
    assert r.verdict == "Type-II"
    assert "lstm's params[5]" in r.culprit  # weight_ih_l0, weight_hh_l0, b, b, weight_ih_l1, hh
    assert "hx" not in r.culprit
