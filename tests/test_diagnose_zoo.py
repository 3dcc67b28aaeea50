"""The four diagnoses on the models readers have, built from small configs with seeded random
weights (no download): Hugging Face transformers models (GPT-2 eager and sdpa, BERT, Llama and
Qwen2 with rotary embeddings and grouped-query attention, eager and sdpa), and plain torch ones:
a CNN (Conv2d, BatchNorm2d in eval mode, ReLU, MaxPool2d, AdaptiveAvgPool2d, Linear) on
images, LSTM and GRU classifiers (embedding, a two-layer recurrent layer, a linear head on the
last state), and an embedding + nn.MultiheadAttention block. Each takes a tokenizer's dict batch
(input_ids, attention_mask with padding) or an image batch. For each: triage(f, f) is Type-I, a
bfloat16 copy (its float inputs cast) is Type-I, and each planted float32 bug is Type-II with
the blame on the module that holds it; gradients, mismatch and determinism run."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from precisionlab import diagnose  # noqa: E402

VOCAB = 100


def batch():
    """A tokenizer's output: two sequences of 8, the second padded after 5 tokens."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 8), generator=g)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    ids[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def images():
    """Two RGB images of 16 x 16."""
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))


def token_ids():
    """The token ids alone, for the recurrent classifiers."""
    return batch()["input_ids"]


# ----------------------------------------------------------------------------- the models


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


def _rotary(family, attn=None):
    """Llama or Qwen2: RMSNorm, rotary embeddings (cos, sin), SwiGLU, grouped-query attention
    (4 query heads, 2 key/value heads)."""
    kw = {} if attn is None else {"attn_implementation": attn}
    config, model = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                     "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[family]
    cfg = config(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=64, vocab_size=VOCAB,
                 max_position_embeddings=32, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                 **kw)
    return model(cfg)


class CNN(nn.Module):
    """Conv2d, BatchNorm2d, ReLU, MaxPool2d twice over, AdaptiveAvgPool2d, Linear: 10 logits."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.pool, self.gap, self.fc = nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Linear(16, 10)
        with torch.no_grad():  # running statistics as training leaves them, not the defaults
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        return self.fc(self.gap(x).flatten(1))


class RNNClassifier(nn.Module):
    """Embedding, a two-layer batch-first LSTM or GRU (hidden 32), Linear on the last layer's
    final state: 3 logits."""

    def __init__(self, kind):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[kind](16, 32, num_layers=2, batch_first=True)
        self.fc = nn.Linear(32, 3)

    def forward(self, input_ids):
        _, h = self.rnn(self.emb(input_ids))
        h = h[0] if isinstance(h, tuple) else h  # LSTM: (h_n, c_n)
        return self.fc(h[-1])


class AttentionBlock(nn.Module):
    """Embedding, nn.MultiheadAttention with the padding mask, a residual LayerNorm, logits over
    the vocabulary."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)
        self.ln, self.lm = nn.LayerNorm(32), nn.Linear(32, VOCAB)

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids)
        a, _ = self.mha(h, h, h, key_padding_mask=attention_mask == 0, need_weights=False)
        return self.lm(self.ln(h + a))


def _scaled(m, path, factor):
    """A float32 bug: the output of module path times factor (an attention scale off by one
    part in 2^7 when the module makes the queries)."""
    def hook(_mod, _inp, out):
        return out * factor
    m.get_submodule(path).register_forward_hook(hook)
    return m


def _eps(m, path, eps):
    """A float32 bug: the normalisation at path with another eps."""
    norm = m.get_submodule(path)
    setattr(norm, "variance_epsilon" if hasattr(norm, "variance_epsilon") else "eps", eps)
    return m


def _param(m, name, factor):
    """A float32 bug: the parameter name times factor."""
    with torch.no_grad():
        m.get_parameter(name).mul_(factor)
    return m


def _hf_bugs(ln, lin):
    return (("scaled output", lambda m: _scaled(m, lin, 1 + 2**-7), lin),
            ("eps", lambda m: _eps(m, ln, 1e-2), ln))


@dataclass(frozen=True)
class Zoo:
    """A model of the zoo: its builder, its inputs, its planted float32 bugs (what, the edit of
    a copy, the module the blame must name) and mismatch's targets (None: the next token)."""

    build: Callable
    bugs: tuple
    inputs: Callable = batch
    targets: Callable | None = None


def _rotary_entry(family, attn=None):
    return Zoo(lambda: _rotary(family, attn), _hf_bugs("model.layers.0.input_layernorm",
                                                       "model.layers.0.self_attn.q_proj"))


def _rnn_entry(kind):
    return Zoo(lambda: RNNClassifier(kind),
               (("recurrent weight", lambda m: _param(m, "rnn.weight_hh_l1", 1 + 2**-5), "rnn"),
                ("scaled embedding", lambda m: _scaled(m, "emb", 1 + 2**-5), "emb")),
               token_ids, lambda: torch.zeros(2, dtype=torch.long))


MODELS = {
    "gpt2-eager": Zoo(lambda: _gpt2("eager"), _hf_bugs("transformer.h.0.ln_1",
                                                       "transformer.h.0.attn.c_attn")),
    "gpt2": Zoo(_gpt2, _hf_bugs("transformer.h.0.ln_1", "transformer.h.0.attn.c_attn")),
    "bert": Zoo(_bert, _hf_bugs("bert.embeddings.LayerNorm",
                                "bert.encoder.layer.0.attention.self.query"),
                targets=lambda: torch.zeros(2, dtype=torch.long)),
    # no logits: triage compares last_hidden_state and pooler_output
    "bert-model": Zoo(lambda: _bert(head=False), _hf_bugs(
        "embeddings.LayerNorm", "encoder.layer.0.attention.self.query")),
    "llama": _rotary_entry("llama"),
    "llama-eager": _rotary_entry("llama", "eager"),
    "qwen2": _rotary_entry("qwen2"),
    "cnn": Zoo(CNN, (("conv bias", lambda m: _param(m, "conv1.bias", 1 + 2**-5), "conv1"),
                     ("batch norm eps", lambda m: _eps(m, "bn2", 1e-2), "bn2")),
               images, lambda: torch.zeros(2, dtype=torch.long)),
    "lstm": _rnn_entry("lstm"),
    "gru": _rnn_entry("gru"),
    "mha": Zoo(AttentionBlock,
               (("in-projection", lambda m: _param(m, "mha.in_proj_weight", 1 + 2**-5), "mha"),
                ("layer norm eps", lambda m: _eps(m, "ln", 1e-2), "ln"))),
}


def model(name):
    torch.manual_seed(0)
    return MODELS[name].build().eval()


def cast_floats(m, dtype=torch.bfloat16):
    """m called with its float inputs cast to dtype (integer ids and masks as they are)."""
    def cast(v):
        return v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    def run(*args, **kwargs):
        return m(*(cast(a) for a in args), **{k: cast(v) for k, v in kwargs.items()})
    return run


@pytest.mark.parametrize("name", list(MODELS))
def test_triage_same_model_is_never_type_ii(name):
    m = model(name)
    r = diagnose.triage(m, m, MODELS[name].inputs())
    assert r.verdict == "Type-I" and r.paired > 0, r.summary()


@pytest.mark.parametrize("name", list(MODELS))
def test_triage_bfloat16_copy_is_round_off(name):
    m = model(name)
    low = copy.deepcopy(m).to(torch.bfloat16)
    b = MODELS[name].inputs()
    r = diagnose.triage(m, cast_floats(low), b)
    assert r.verdict == "Type-I", r.summary()
    assert not any(c.self_outside for c in r.checks)
    if isinstance(b, dict):
        assert b["input_ids"].dtype == torch.int64  # integer inputs are never cast


@pytest.mark.parametrize("name", list(MODELS))
def test_triage_planted_float32_bugs_are_type_ii(name):
    m = model(name)
    for what, plant, blamed in MODELS[name].bugs:
        r = diagnose.triage(m, plant(copy.deepcopy(m)), MODELS[name].inputs())
        assert r.verdict == "Type-II" and r.blamed.op.startswith(blamed), (what, r.blamed)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_rotary_models_without_a_mask_take_grouped_query_sdpa(name):
    """Without an attention_mask transformers calls sdpa with enable_gqa=True (key and value
    heads repeated inside it): identical programs and the bfloat16 copy stay Type-I."""
    m = model(name)
    ids = {"input_ids": batch()["input_ids"]}
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if getattr(func, "__name__", "") == "scaled_dot_product_attention":
                seen.append(kwargs.get("enable_gqa", False))
            return func(*args, **kwargs)
    with Spy(), torch.no_grad():
        m(**ids)
    assert seen and all(seen)
    assert diagnose.triage(m, m, ids).verdict == "Type-I"
    low = copy.deepcopy(m).to(torch.bfloat16)
    assert diagnose.triage(m, low, ids).verdict == "Type-I"


def test_triage_output_keyword_chooses_a_field():
    m = model("gpt2-eager")
    r = diagnose.triage(m, m, batch(), output="logits")
    assert r.verdict == "Type-I"
    with pytest.raises(ValueError, match="valid fields: logits"):
        diagnose.triage(m, m, batch(), output="hidden")
    with pytest.raises(ValueError, match="selects a field"):
        diagnose.triage(nn.Linear(2, 2), nn.Linear(2, 2), torch.ones(1, 2), output="logits")


def _logits(out):
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if "logits" in out else out.last_hidden_state


@pytest.mark.parametrize("name", list(MODELS))
def test_gradients_mismatch_determinism_run(name):
    m, entry = model(name), MODELS[name]
    b = entry.inputs()
    g = diagnose.gradients(m, lambda out: _logits(out).float().pow(2).mean(), b)
    assert len(g.tensors) > 0
    if name != "bert-model":  # mismatch needs logits
        targets = None if entry.targets is None else entry.targets()
        r = diagnose.mismatch(m, b, targets=targets, cast_inputs=name == "cnn")
        assert r.beta.shape == ((2, 7) if targets is None else (2,))
    d = diagnose.determinism(m, b, threads=(1, 2), deterministic=False)
    assert any(t.startswith("output") for t in d.tensors), d.tensors


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
