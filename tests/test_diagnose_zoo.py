"""The four diagnoses on Hugging Face transformers models, built from small configs with seeded
random weights (no download): GPT-2 (eager attention and the default), BERT, and Llama (rotary
embeddings: cos/sin have no interval rule yet, an expected UnsupportedOperation). Each takes a
tokenizer's dict batch (input_ids, attention_mask with padding) and returns a ModelOutput."""

from __future__ import annotations

import copy
import os

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from precisionlab import diagnose  # noqa: E402

VOCAB = 100


def _gpt2(attn=None):
    kw = {} if attn is None else {"attn_implementation": attn}
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB,
                                  n_positions=32, bos_token_id=0, eos_token_id=0, **kw)
    return transformers.GPT2LMHeadModel(cfg)


def _bert(head=True):
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=VOCAB, num_labels=3,
                                  max_position_embeddings=32)
    return (transformers.BertForSequenceClassification if head else transformers.BertModel)(cfg)


def _llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=64,
                                   vocab_size=VOCAB, max_position_embeddings=32,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg)


# (builder, the first LayerNorm, a Linear-like module whose output the planted bug scales)
MODELS = {
    "gpt2-eager": (lambda: _gpt2("eager"), "transformer.h.0.ln_1", "transformer.h.0.attn.c_attn"),
    "gpt2": (lambda: _gpt2(), "transformer.h.0.ln_1", "transformer.h.0.attn.c_attn"),
    "bert": (_bert, "bert.embeddings.LayerNorm", "bert.encoder.layer.0.attention.self.query"),
    # no logits: triage compares last_hidden_state and pooler_output
    "bert-model": (lambda: _bert(head=False), "embeddings.LayerNorm",
                   "encoder.layer.0.attention.self.query"),
    "llama": (_llama, "model.layers.0.input_layernorm", "model.layers.0.self_attn.q_proj"),
}


def model(name):
    torch.manual_seed(0)
    return MODELS[name][0]().eval()


def batch():
    """A tokenizer's output: two sequences of 8, the second padded after 5 tokens."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 8), generator=g)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    ids[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _scaled(m, path, factor):
    """A float32 bug: the output of module path times factor (an attention scale off by one
    part in 2^7 when the module makes the queries)."""
    def hook(_mod, _inp, out):
        return out * factor
    m.get_submodule(path).register_forward_hook(hook)
    return m


@pytest.mark.parametrize("name", list(MODELS))
def test_triage_same_model_is_never_type_ii(name):
    m = model(name)
    r = diagnose.triage(m, m, batch())
    assert r.verdict == "Type-I" and r.paired > 0


@pytest.mark.parametrize("name", list(MODELS))
def test_triage_bfloat16_copy_is_round_off(name):
    m = model(name)
    low = copy.deepcopy(m).to(torch.bfloat16)
    b = batch()
    r = diagnose.triage(m, low, b)
    assert r.verdict == "Type-I", r.summary()
    assert b["input_ids"].dtype == torch.int64  # integer inputs are never cast


@pytest.mark.parametrize("name", list(MODELS))
def test_triage_planted_float32_bugs_are_type_ii(name):
    m = model(name)
    _, ln, lin = MODELS[name]
    scaled = _scaled(copy.deepcopy(m), lin, 1 + 2**-7)
    r = diagnose.triage(m, scaled, batch())
    assert r.verdict == "Type-II" and r.blamed.op.startswith(lin), r.blamed
    eps = copy.deepcopy(m)
    norm = eps.get_submodule(ln)
    setattr(norm, "variance_epsilon" if hasattr(norm, "variance_epsilon") else "eps", 1e-2)
    r = diagnose.triage(m, eps, batch())
    assert r.verdict == "Type-II" and r.blamed.op.startswith(ln), r.blamed


def test_triage_output_keyword_chooses_a_field():
    m = model("gpt2-eager")
    r = diagnose.triage(m, m, batch(), output="logits")
    assert r.verdict == "Type-I"
    with pytest.raises(ValueError, match="valid fields: logits"):
        diagnose.triage(m, m, batch(), output="hidden")
    with pytest.raises(ValueError, match="selects a field"):
        diagnose.triage(nn.Linear(2, 2), nn.Linear(2, 2), torch.ones(1, 2), output="logits")


def _logits(out):
    return out.logits if "logits" in out else out.last_hidden_state


@pytest.mark.parametrize("name", list(MODELS))
def test_gradients_mismatch_determinism_run(name):
    m = model(name)
    b = batch()
    g = diagnose.gradients(m, lambda out: _logits(out).float().pow(2).mean(), b)
    assert len(g.tensors) > 0
    if name != "bert-model":  # mismatch needs logits
        targets = torch.zeros(2, dtype=torch.long) if name == "bert" else None
        r = diagnose.mismatch(m, b, targets=targets)
        assert r.beta.shape == ((2,) if name == "bert" else (2, 7))
    d = diagnose.determinism(m, b, threads=(1, 2), deterministic=False)
    assert any(("logits" in t or "last_hidden_state" in t) for t in d.tensors), d.tensors


def test_mismatch_restores_each_submodules_own_mode():
    inner = model("gpt2-eager")  # eval mode, inside a wrapper that starts in training mode
    wrapper = nn.Module()
    wrapper.lm = inner
    wrapper.forward = lambda **kw: wrapper.lm(**kw)
    before = {n: mod.training for n, mod in wrapper.named_modules()}
    assert before[""] and not before["lm"]
    diagnose.mismatch(wrapper, batch())
    assert {n: mod.training for n, mod in wrapper.named_modules()} == before


def test_dict_batches_and_model_outputs_in_plain_torch():
    class Keywords(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lin = nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB)

        def forward(self, input_ids, attention_mask):
            h = self.emb(input_ids) * attention_mask.unsqueeze(-1)
            return {"logits": self.lin(h), "hidden": h}

    torch.manual_seed(0)
    k = Keywords().eval()
    assert diagnose.triage(k, k, batch()).verdict == "Type-I"
    assert diagnose.triage(k, k, batch(), output="hidden").verdict == "Type-I"
    assert diagnose.mismatch(k, batch()).beta.shape == (2, 7)
    with pytest.raises(ValueError, match="dict of keyword inputs"):
        diagnose.triage(k, k, {})
    ids = batch()["input_ids"]
    with pytest.raises(ValueError, match=r"holding a dict.*pass the dict alone"):
        diagnose.triage(k, k, (ids, {"attention_mask": batch()["attention_mask"]}))
    enc = transformers.BatchEncoding(batch())  # what a tokenizer returns
    m = model("gpt2-eager")
    assert diagnose.triage(m, copy.deepcopy(m).to(torch.bfloat16), enc).verdict == "Type-I"
    assert diagnose.mismatch(m, enc).beta.shape == (2, 7)
    # a target returning the logits tensor is compared with the reference's .logits
    low = copy.deepcopy(m).to(torch.bfloat16)
    assert diagnose.triage(m, lambda **kw: low(**kw).logits, enc).verdict == "Type-I"


def test_dict_outputs_pair_by_key_not_by_position():
    """Two identical modules whose dicts list the same keys in another order are one program."""
    class Ordered(nn.Module):
        def __init__(self, keys):
            super().__init__()
            self.keys, self.lin = keys, nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            got = {"a": y * 2, "c": y + 1}
            return {k: got[k] for k in self.keys}

    class Outer(nn.Module):  # the dict-returning module inside a tensor-returning model
        def __init__(self, keys):
            super().__init__()
            self.d = Ordered(keys)

        def forward(self, x):
            out = self.d(x)
            return out["a"] - out["c"]

    torch.manual_seed(0)
    ac, ca = Ordered(("a", "c")), Ordered(("c", "a"))
    ca.load_state_dict(ac.state_dict())
    x = torch.randn(3, 4)
    assert diagnose.triage(ac, ca, x, output="a").verdict == "Type-I"
    assert diagnose.triage(ac, ca, x).verdict == "Type-I"
    outer_ac, outer_ca = Outer(("a", "c")), Outer(("c", "a"))
    outer_ca.load_state_dict(outer_ac.state_dict())
    assert diagnose.triage(outer_ac, outer_ca, x).verdict == "Type-I"


def test_unsupported_operation_names_the_op_its_module_and_what_to_do():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LPPool2d(2, 2))
    with pytest.raises(diagnose.UnsupportedOperation) as err:
        diagnose.triage(m, m, torch.randn(1, 3, 8, 8))
    msg = str(err.value)
    assert "'lp_pool2d' in module '1'; no interval rule bounds 'lp_pool2d'" in msg
    assert "diagnose.supported() lists them" in msg and "file an issue" in msg
    assert len(msg) < 400  # no list of every supported name


def test_zero_size_tensors_are_checked_without_a_worst_element():
    x = torch.randn(3, 4)
    f = lambda z: (z[:0] * 2, z + 1)  # noqa: E731
    r = diagnose.triage(f, f, x)
    empty = [c for c in r.checks if c.numel == 0]
    assert r.verdict == "Type-I" and empty and all(c.element == () for c in empty)
    bug = lambda z: (z[:0] * 2, z + 1.01)  # noqa: E731
    assert diagnose.triage(f, bug, x).verdict == "Type-II"
    m = model("gpt2-eager")  # its zero-size cache tensors
    r = diagnose.triage(m, m, batch())
    assert any(c.numel == 0 for c in r.checks)
    str(r), r.table()
    plt.close(r.plot().figure)
