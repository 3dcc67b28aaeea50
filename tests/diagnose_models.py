"""Small models for the diagnose tests that chapter 8 does not use: a CNN and a masked encoder."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class SmallCNN(nn.Module):
    """Two convolutions, a pooled linear head: logits over `classes`."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.c1 = nn.Conv2d(1, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        return self.head(x.mean(dim=(2, 3)))


class EncoderLayer(nn.Module):
    """Post-norm self-attention with a key-padding mask, written out op by op."""

    def __init__(self, d: int, heads: int, mask: str = "additive"):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.f1, self.f2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.heads, self.mask = heads, mask

    def forward(self, x, pad):
        b, t, d = x.shape
        h = self.heads

        def split(z):
            return z.reshape(b, t, h, d // h).permute(0, 2, 1, 3)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // h)
        keep = ~pad[:, None, None, :]
        if self.mask == "additive":  # the -1e4 convention of older BERT code
            s = s + (1.0 - keep.to(s.dtype)) * -1e4
        else:
            s = s.masked_fill(~keep, float("-inf"))
        a = torch.softmax(s, dim=-1)
        y = torch.matmul(a, v).permute(0, 2, 1, 3).reshape(b, t, d)
        x = self.n1(x + self.o(y))
        return self.n2(x + self.f2(F.silu(self.f1(x))))


class MaskedEncoder(nn.Module):
    """Token embedding, two encoder layers, a linear head over the vocabulary."""

    def __init__(self, vocab: int = 23, d: int = 16, heads: int = 2, mask: str = "additive"):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([EncoderLayer(d, heads, mask) for _ in range(2)])
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens, pad):
        x = self.emb(tokens)
        for layer in self.layers:
            x = layer(x, pad)
        return self.head(x)


def encoder_batch(seed: int = 0, b: int = 3, t: int = 7, vocab: int = 23):
    """(tokens, pad): random tokens and a padding mask hiding the last positions of some rows."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (b, t), generator=g)
    lengths = torch.tensor([t, t - 2, t - 4][:b])
    pad = torch.arange(t)[None, :] >= lengths[:, None]
    return tokens, pad
