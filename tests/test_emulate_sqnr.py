"""precisionlab.emulate.sqnr: the signal-to-noise ratio by the fixed-order sum against
exactly rounded sums (math.fsum)."""

from __future__ import annotations

import math

import pytest
import torch
from oracles import fsum_sqnr

from precisionlab import emulate
from precisionlab.emulate import sqnr_db


def test_sqnr_db_matches_exactly_rounded_sums():
    gen = torch.Generator().manual_seed(3)
    x = emulate.randn(37, 11, generator=gen, dtype=torch.float64)
    xhat = x + 1e-3 * emulate.randn(37, 11, generator=gen, dtype=torch.float64)
    assert sqnr_db(x, xhat) == pytest.approx(fsum_sqnr(x, xhat), rel=1e-12)
    assert sqnr_db(x, x) == math.inf
    assert sqnr_db(x, torch.zeros_like(x)) == 0.0  # nothing kept
    with pytest.raises(ValueError, match="same shape"):
        sqnr_db(x, x[:3])
    with pytest.raises(ValueError, match="all zeros"):
        sqnr_db(torch.zeros(4), torch.zeros(4))
