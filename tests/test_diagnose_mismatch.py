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
