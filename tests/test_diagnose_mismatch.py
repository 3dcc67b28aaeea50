"""diagnose.mismatch against separate float32 / bfloat16 / autocast forwards."""

import copy
import math

import numpy as np
import pytest
import torch
from diagnose_models import MaskedEncoder, SmallCNN, encoder_batch

from precisionlab import diagnose


def _model(seed=0):
    torch.manual_seed(seed)
    return MaskedEncoder().eval()


def _logp(logits, targets):
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp.gather(-1, targets[..., None]).squeeze(-1).double().numpy()


def test_beta_matches_separate_forwards():
    m = _model()
    tokens, pad = encoder_batch()
    targets = torch.roll(tokens, 1, dims=1)
    r = diagnose.mismatch(m, (tokens, pad), targets=targets, eps=0.001)
    with torch.no_grad():
        a = _logp(m(tokens, pad), targets)
        b = _logp(copy.deepcopy(m).to(torch.bfloat16)(tokens, pad), targets)
    assert np.array_equal(r.beta, a - b) and np.array_equal(r.logp_reference, a)
    ratio = [math.exp(x) for x in (a - b).ravel()]
    assert r.share_outside == sum(not 0.999 <= q <= 1.001 for q in ratio) / len(ratio)
    assert 0 < r.share_outside < 1  # the case has tokens on both sides of 1 +- eps
    assert r.max_abs == max(abs(x) for x in (a - b).ravel())
    worst = r.worst(1)[0]
    assert abs(worst[3]) == r.max_abs


def test_autocast_setting_and_next_token_default():
    m = _model(1)
    tokens, pad = encoder_batch(1)
    r = diagnose.mismatch(m, (tokens, pad), other="autocast_bfloat16")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        b = _logp(m(tokens, pad)[:, :-1], tokens[:, 1:])
    with torch.no_grad():
        a = _logp(m(tokens, pad)[:, :-1], tokens[:, 1:])
    assert np.array_equal(r.beta, a - b)
    assert all(len(line) <= 80 for line in str(r).splitlines())


def test_bad_input_names_the_argument():
    m = _model()
    tokens, pad = encoder_batch()
    with pytest.raises(ValueError, match="unknown precision setting 'bf16'"):
        diagnose.mismatch(m, (tokens, pad), other="bf16")
    with pytest.raises(ValueError, match="targets must be integer token ids of shape"):
        diagnose.mismatch(m, (tokens, pad), targets=tokens[:, :3])
    with pytest.raises(ValueError, match="eps must be"):
        diagnose.mismatch(m, (tokens, pad), eps=2)
    cnn = SmallCNN(classes=1)
    with pytest.raises(ValueError, match="model must return logits"):
        diagnose.mismatch(cnn, torch.randn(2, 1, 4, 4), targets=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"model must be a torch\.nn\.Module"):
        diagnose.mismatch(lambda t, p: t, (tokens, pad))


def _gpt2():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _padded(lengths, t=8, left=False):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 100, (len(lengths), t), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        sl = slice(t - n, t) if left else slice(0, n)
        mask[i, sl] = 1
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


@pytest.mark.parametrize("left", [False, True])
def test_padded_positions_are_excluded(left):
    """beta's statistics on a padded GPT-2 batch are those of the real positions alone: position
    t (scoring token t + 1) counts when tokens t and t + 1 are both real."""
    m = _gpt2()
    batch = _padded([8, 5, 3], left=left)
    r = diagnose.mismatch(m, batch, eps=0.001)
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    with torch.no_grad():
        a = _logp(m(**batch).logits[:, :-1], ids[:, 1:])
        b = _logp(copy.deepcopy(m).to(torch.bfloat16)(**batch).logits[:, :-1], ids[:, 1:])
    real = (mask[:, :-1] & mask[:, 1:]).numpy()
    beta = (a - b)[real]
    assert r.tokens == real.sum() == 7 + 4 + 2 and r.padded == 3 * 7 - r.tokens
    assert np.array_equal(r.counted, real) and np.isnan(r.beta[~real]).all()
    assert np.array_equal(r.beta[real], beta)
    assert r.mean == math.fsum(beta) / beta.size
    assert r.std == math.sqrt(math.fsum((beta - r.mean) ** 2) / beta.size)
    assert r.max_abs == np.abs(beta).max()
    ratio = np.exp(beta)
    assert r.share_outside == np.count_nonzero((ratio < 0.999) | (ratio > 1.001)) / beta.size
    assert all(real[idx] for idx, *_ in r.worst(50)) and len(r.worst(50)) == r.tokens
    assert f"{r.tokens} tokens ({r.padded} padded positions excluded)" in r.summary()
    r.plot()
    # with targets given, a position counts where its own token is real
    rt = diagnose.mismatch(m, batch, targets=ids)
    assert np.array_equal(rt.counted, mask.numpy()) and rt.tokens == 8 + 5 + 3


def test_padded_rows_score_as_the_unpadded_rows_alone():
    """Right padding: each row's log p at its real positions is what the row alone gives."""
    m = _gpt2()
    batch = _padded([8, 5, 3])
    r = diagnose.mismatch(m, batch)
    for i, n in enumerate([8, 5, 3]):
        row = diagnose.mismatch(m, batch["input_ids"][i:i + 1, :n])
        assert row.padded == 0 and row.tokens == n - 1
        np.testing.assert_allclose(r.logp_reference[i, :n - 1], row.logp_reference[0],
                                   rtol=0, atol=1e-5)
        assert np.isnan(r.logp_reference[i, n - 1:]).all()


def test_a_classifier_counts_every_sequence():
    """A per-sequence output (logits (batch, classes)) is not masked by the token mask."""
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Flatten(), torch.nn.Linear(12, 3))

    class Clf(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids * attention_mask)
    ids = torch.tensor([[1, 2, 3], [4, 5, 0]])
    batch = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    r = diagnose.mismatch(Clf(), batch, targets=torch.tensor([0, 2]))
    assert r.counted is None and r.tokens == 2 and "padded" not in r.summary()


def test_the_cast_copy_keeps_tied_weights_and_the_original():
    from precisionlab.diagnose.mismatch import cast_copy
    m = _gpt2()
    low = cast_copy(m, torch.bfloat16)
    assert low.lm_head.weight is low.transformer.wte.weight
    assert all(p.dtype == torch.bfloat16 for p in low.parameters())
    assert all(p.dtype == torch.float32 for p in m.parameters())
    ref = copy.deepcopy(m).to(torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(low.state_dict().values(),
                                                 ref.state_dict().values(), strict=True))
