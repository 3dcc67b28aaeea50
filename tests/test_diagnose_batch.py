"""What the four diagnoses take: cast_inputs=True (the batch's floating tensors cast to each
program's parameter dtype, integer ids and masks never), the error that shows it, and the
README's diagnose lines run as written on a transformers model with a tokenizer's dict."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from precisionlab import diagnose
from precisionlab.diagnose.batch import as_inputs, for_program, param_dtype

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _batch():
    ids = torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 5)).eval()


def test_for_program_casts_floats_to_the_parameter_dtype_and_never_ints():
    low = _cnn().to(torch.bfloat16)
    ins = as_inputs({"x": torch.ones(2), "ids": torch.ones(2, dtype=torch.long),
                     "mask": torch.ones(2, dtype=torch.bool), "flag": 3})
    out = for_program(low, ins, True)
    assert [type(v) if not isinstance(v, torch.Tensor) else v.dtype for v in out] == [
        torch.bfloat16, torch.long, torch.bool, int]
    assert out.names == ins.names and for_program(low, ins, False) is ins
    assert param_dtype(lambda z: low(z)) == torch.bfloat16  # a function closing over it
    assert param_dtype(torch.sin) is None and for_program(torch.sin, ins, True) is ins
    with pytest.raises(ValueError, match="cast_inputs must be True or False; got cast_inputs=1"):
        for_program(low, ins, 1)


def test_a_bfloat16_image_model_names_the_keyword_or_takes_it():
    """A bfloat16 copy of an image model given float32 images: a ValueError naming both dtypes
    and showing cast_inputs=True (not torch's dtype error); with it, triage says Type-I."""
    cnn = _cnn()
    low = copy.deepcopy(cnn).to(torch.bfloat16)
    x = torch.randn(2, 3, 6, 6)
    for run in (lambda **kw: diagnose.triage(cnn, low, x, **kw),
                lambda **kw: diagnose.determinism(low, x, threads=(1,), **kw)):
        with pytest.raises(ValueError, match=r"bfloat16 parameters but the batch holds float32 "
                           r"tensors.*pass cast_inputs=True.*lambda x: model\(x\.to\(torch\."
                           r"bfloat16\)\)"):
            run()
        run(cast_inputs=True)
    assert diagnose.triage(cnn, low, x, cast_inputs=True).verdict == "Type-I"
    d = diagnose.determinism(low, x, threads=(1,), repeats=1, deterministic=False,
                             loss_fn=lambda o: o.float().sum(), cast_inputs=True)
    assert d.changed() == 0


def test_the_readme_lines_on_gpt2_with_a_tokenizer_batch():
    """README: gradients and triage as written; mismatch and determinism on the same batch."""
    model, batch = _gpt2(), _batch()
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    ids = batch["input_ids"]

    def loss_fn(out):
        return F.cross_entropy(out.logits[:, :-1].reshape(-1, 100), ids[:, 1:].reshape(-1))
    g = diagnose.gradients(model, loss_fn, batch)
    assert g.total("numel", "") == sum(p.numel() for p in model.parameters())
    t = diagnose.triage(model, model_bf16, batch)
    assert t.verdict == "Type-I" and t.paired > 50
    m = diagnose.mismatch(model, batch)
    assert m.padded == 3 and "3 padded positions excluded" in m.summary()
    d = diagnose.determinism(model, batch, threads=(1, 2))
    assert "output['logits']" in d.tensors
    for r in (g, t, m, d):
        assert str(r)
    # the bfloat16 model itself: its gradients come from a float32 copy
    assert "float32 copy" in diagnose.gradients(model_bf16, loss_fn, batch).summary()


def test_inputs_embeds_are_cast_for_a_bfloat16_gpt2():
    model, batch = _gpt2(), _batch()
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        emb = model.transformer.wte(batch["input_ids"])
    eb = {"inputs_embeds": emb, "attention_mask": batch["attention_mask"]}
    with pytest.raises(ValueError, match="cast_inputs=True"):
        diagnose.triage(model, model_bf16, eb)
    assert diagnose.triage(model, model_bf16, eb, cast_inputs=True).verdict == "Type-I"
    r = diagnose.mismatch(model_bf16, eb, targets=batch["input_ids"], reference="float32",
                          other="autocast_bfloat16", cast_inputs=True)
    assert r.padded == 3 and r.tokens == 13
    diagnose.determinism(model_bf16, eb, threads=(1,), deterministic=False, cast_inputs=True)


class _Wrap(nn.Module):
    """A wrapper a reader writes around a model: one child, no parameters of its own."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, **batch):
        return self.inner(**batch)


def test_a_wrapped_target_pairs_module_by_module_with_the_bare_model():
    model, batch = _gpt2(), _batch()
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    bare = diagnose.triage(model, model_bf16, batch)
    wrapped = diagnose.triage(model, _Wrap(model_bf16), batch)
    assert wrapped.verdict == bare.verdict == "Type-I"
    assert wrapped.paired == bare.paired > 50  # not just the final output
    assert [c.op for c in wrapped.checks] == [c.op for c in bare.checks]
    bug = copy.deepcopy(model)
    with torch.no_grad():
        bug.transformer.h[1].mlp.c_fc.weight.mul_(1 + 2.0**-5)  # (its bias starts at 0)
    rep = diagnose.triage(model, _Wrap(bug), batch)
    assert rep.verdict == "Type-II"
    assert rep.blamed.op.startswith("transformer.h.1.mlp.c_fc:")  # named as in the model
